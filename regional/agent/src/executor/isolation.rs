//! What a real worker runs as and what it may touch (docs/jobs.md, "What a
//! job can see"). A job is hostile code: it must reach nothing of the
//! agent's (credentials, files, processes) and nothing of other tenants'.
//!
//! - **A user per tenant.** Every worker runs as its tenant's unprivileged
//!   system user: `gw-{tenant}`, created with `useradd --system` on first
//!   use, or the user the agent's configuration maps the tenant to. Never
//!   root, never the agent's own user. A worker's directories are that
//!   user's (0700); the agent's directories above them can be crossed but
//!   not listed (0711), and everything else the agent writes is its own
//!   (umask 077).
//! - **A clean environment.** The job's `env`, the contract's variables
//!   and a minimal `PATH`, `HOME` and `LANG`: nothing of the agent's.
//! - **A sandbox** where bubblewrap is installed: its own PID and IPC
//!   namespaces and `/proc` (no other process of the machine in sight), a
//!   private `/tmp` and `/dev/shm`, a minimal `/dev` with the GPU devices
//!   of its own GPUs, the system read-only, the agent's directories hidden
//!   (an empty directory in their place), and only its own directories —
//!   and the shared paths the operator binds — writable. bubblewrap runs as
//!   root to build it; inside, `setpriv` drops to the tenant's user (no
//!   capabilities, no new privileges), and `env -i` sets the job's
//!   environment last, so that nothing the tenant chose (`LD_PRELOAD`, say)
//!   reaches a process running as root.
//!
//! The agent (root) opens what a worker leaves with care: its logs with
//! `O_NOFOLLOW`, its checkpoint files only when the open file is the
//! worker's user's own (gangway_checkpoint's `Upload::owner`), so that a
//! symbolic link a hostile job slips in cannot make the agent read or
//! write anything but the job's own files.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::config::{IsolationConfig, IsolationMode, SandboxBind};

/// The `PATH` a worker starts with unless its job sets one.
pub(crate) const WORKER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The unprivileged user a worker runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// The programs a sandbox is made with.
#[derive(Clone, Debug)]
struct Tools {
    bwrap: PathBuf,
    setpriv: PathBuf,
    env: PathBuf,
}

#[derive(Clone, Debug)]
enum Mode {
    Sandbox(Tools),
    User,
    Off,
}

/// Why the agent cannot isolate its workers as configured.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error(
        "the agent does not run as root, so it cannot run workers as their tenants' users: \
         run it as root, or pass --isolation off (workers then run as the agent's own user, \
         with its files and credentials in reach: for a single-user machine only)"
    )]
    NotRoot,
    #[error(
        "--isolation sandbox needs {0} on PATH: install it (apt-get install bubblewrap \
         util-linux coreutils), or choose --isolation user"
    )]
    Missing(&'static str),
    #[error(
        "the work directory {work_dir} cannot be reached by workers' users without a sandbox: \
         {blocker} has mode {mode:o} (no search permission for others); install bubblewrap, \
         or choose a work directory under /var/lib, or chmod o+x {blocker}"
    )]
    Unreachable {
        work_dir: PathBuf,
        blocker: PathBuf,
        mode: u32,
    },
    #[error("tenant user mapping {tenant}={user}: {why}")]
    Mapping {
        tenant: String,
        user: String,
        why: String,
    },
    #[error("--sandbox-bind {}: no such directory or file on this machine", .0.display())]
    Bind(PathBuf),
    #[error("cannot prepare the work directory {}: {source}", path.display())]
    WorkDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How workers are isolated, resolved once at the agent's start.
#[derive(Debug)]
pub(crate) struct Isolation {
    mode: Mode,
    tenant_users: BTreeMap<String, String>,
    binds: Vec<SandboxBind>,
    /// Outermost first; none inside another.
    hide: Vec<PathBuf>,
    /// GPU index → `/dev/nvidia{minor}`, from NVML; `None`: unknown, every
    /// GPU device node is bound.
    gpu_minors: Option<BTreeMap<u32, u32>>,
    /// Tenants' users, once looked up or created.
    users: Mutex<BTreeMap<String, RunAs>>,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `name` on `PATH` (or the usual system directories), if executable.
fn find_program(name: &str, path: &str) -> Option<PathBuf> {
    path.split(':')
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

impl Isolation {
    /// No isolation: workers run as the agent's user (tests of the
    /// executor's mechanics, and `--isolation off`).
    pub fn off() -> Isolation {
        Isolation {
            mode: Mode::Off,
            tenant_users: BTreeMap::new(),
            binds: Vec::new(),
            hide: Vec::new(),
            gpu_minors: None,
            users: Mutex::new(BTreeMap::new()),
        }
    }

    /// Resolves `config` for an agent working in `work_dir` (absolute),
    /// hiding `work_dir`, `store_dir` (a local checkpoint store) and the
    /// configured paths from sandboxed workers. Prepares `work_dir` (0711)
    /// and, when isolating, sets the agent's umask to 077.
    pub fn resolve(
        config: &IsolationConfig,
        work_dir: &Path,
        store_dir: Option<&Path>,
    ) -> Result<Isolation, IsolationError> {
        let system_path = std::env::var("PATH").unwrap_or_default();
        let tools = || -> Result<Tools, IsolationError> {
            Ok(Tools {
                bwrap: find_program("bwrap", &system_path)
                    .ok_or(IsolationError::Missing("bwrap (bubblewrap)"))?,
                setpriv: find_program("setpriv", &system_path)
                    .ok_or(IsolationError::Missing("setpriv (util-linux)"))?,
                env: find_program("env", &system_path)
                    .ok_or(IsolationError::Missing("env (coreutils)"))?,
            })
        };
        let mode = match config.mode {
            IsolationMode::Off => Mode::Off,
            _ if !is_root() => return Err(IsolationError::NotRoot),
            IsolationMode::Sandbox => Mode::Sandbox(tools()?),
            IsolationMode::User => Mode::User,
            IsolationMode::Auto => match tools() {
                Ok(t) => Mode::Sandbox(t),
                Err(e) => {
                    tracing::warn!(
                        reason = %e,
                        "no sandbox for workers: they run as their tenants' users only, and \
                         see the machine's processes and world-readable files; install \
                         bubblewrap for the sandbox"
                    );
                    Mode::User
                }
            },
        };
        if matches!(mode, Mode::Off) {
            return Ok(Isolation::off());
        }
        // Everything the agent writes is its own unless it says otherwise.
        // SAFETY: umask has no preconditions.
        unsafe { libc::umask(0o077) };
        std::fs::create_dir_all(work_dir)
            .and_then(|_| std::fs::set_permissions(work_dir, PermissionsExt::from_mode(0o711)))
            .map_err(|source| IsolationError::WorkDir {
                path: work_dir.to_path_buf(),
                source,
            })?;
        // A local checkpoint store holds every tenant's checkpoints (and a
        // peer region's copies, which the region writes): the agent's.
        if let Some(store) = store_dir {
            std::fs::create_dir_all(store)
                .and_then(|_| std::fs::set_permissions(store, PermissionsExt::from_mode(0o700)))
                .map_err(|source| IsolationError::WorkDir {
                    path: store.to_path_buf(),
                    source,
                })?;
        }
        if matches!(mode, Mode::User) {
            if let Some((blocker, mode)) = unreachable_ancestor(work_dir) {
                return Err(IsolationError::Unreachable {
                    work_dir: work_dir.to_path_buf(),
                    blocker,
                    mode,
                });
            }
        }
        if let Some(missing) = config.binds.iter().find(|b| !b.path.exists()) {
            return Err(IsolationError::Bind(missing.path.clone()));
        }
        for (tenant, user) in &config.tenant_users {
            let bad = |why: String| IsolationError::Mapping {
                tenant: tenant.clone(),
                user: user.clone(),
                why,
            };
            match lookup_user(user) {
                Ok(Some(u)) => check_unprivileged(&u).map_err(bad)?,
                Ok(None) => return Err(bad("no such user".into())),
                Err(e) => return Err(bad(e.to_string())),
            }
        }
        // The agent's directories, and the directories above them that
        // others cannot cross (a checkout under /root, say): inside the
        // sandbox those are empty, and the worker's own directories are
        // bound back into them.
        let mut hide: Vec<PathBuf> = [Some(work_dir), store_dir]
            .into_iter()
            .flatten()
            .map(|p| unreachable_ancestor(p).map_or_else(|| p.to_path_buf(), |(a, _)| a))
            .chain(config.hide.iter().cloned())
            .filter(|p| p.is_absolute() && p.is_dir())
            // A private /tmp hides what is under it already.
            .filter(|p| !p.starts_with("/tmp"))
            .collect();
        hide.sort();
        hide.dedup();
        let hide = hide
            .iter()
            .filter(|p| !hide.iter().any(|q| q != *p && p.starts_with(q)))
            .cloned()
            .collect();
        let isolation = Isolation {
            mode,
            tenant_users: config.tenant_users.clone(),
            binds: config.binds.clone(),
            hide,
            gpu_minors: nvml_minors(),
            users: Mutex::new(BTreeMap::new()),
        };
        tracing::info!(
            isolation = isolation.mode_name(),
            hidden = ?isolation.hide,
            "workers run as their tenants' users"
        );
        Ok(isolation)
    }

    /// `sandbox`, `user` or `off`.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Sandbox(_) => "sandbox",
            Mode::User => "user",
            Mode::Off => "off",
        }
    }

    pub fn sandboxed(&self) -> bool {
        matches!(self.mode, Mode::Sandbox(_))
    }

    /// The user `tenant`'s workers run as (created on first use); `None`
    /// without isolation. Blocking: it may run `useradd`.
    pub fn run_as(&self, tenant: &str) -> Result<Option<RunAs>, String> {
        if matches!(self.mode, Mode::Off) {
            return Ok(None);
        }
        if !gangway_shared::ids::valid_tenant(tenant) {
            return Err(format!(
                "the assignment names no valid tenant ({tenant:?}): a worker never runs without \
                 its tenant's user (is the region older than the agent?)"
            ));
        }
        let mut users = self.users.lock().expect("users lock");
        if let Some(u) = users.get(tenant) {
            return Ok(Some(u.clone()));
        }
        let user = match self.tenant_users.get(tenant) {
            Some(name) => lookup_user(name)
                .map_err(|e| format!("looking up user {name}: {e}"))?
                .ok_or_else(|| format!("user {name} (mapped to tenant {tenant}) does not exist"))?,
            None => ensure_tenant_user(tenant)?,
        };
        check_unprivileged(&user)?;
        users.insert(tenant.to_string(), user.clone());
        Ok(Some(user))
    }

    /// The command that runs `w`: straight, as `user`, or in a sandbox as
    /// `user`. With a sandbox, also the pipe bubblewrap writes its
    /// sandbox's first process to ([`SandboxInfo`]).
    pub fn command(
        &self,
        w: &WorkerLaunch<'_>,
        user: Option<&RunAs>,
    ) -> Result<(std::process::Command, Option<SandboxInfo>), String> {
        let (program, args) = w.command.split_first().ok_or("empty command")?;
        match (&self.mode, user) {
            (Mode::Sandbox(tools), Some(user)) => {
                self.sandboxed_command(tools, w, user, program, args)
            }
            (Mode::User, Some(user)) => {
                let mut cmd = plain_command(w, program, args);
                cmd.uid(user.uid).gid(user.gid);
                // std drops supplementary groups when it changes the uid.
                // SAFETY: prctl is async-signal-safe.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                Ok((cmd, None))
            }
            (Mode::Off, _) => Ok((plain_command(w, program, args), None)),
            (_, None) => Err("no user to run the worker as".into()),
        }
    }

    fn sandboxed_command(
        &self,
        tools: &Tools,
        w: &WorkerLaunch<'_>,
        user: &RunAs,
        program: &str,
        args: &[String],
    ) -> Result<(std::process::Command, Option<SandboxInfo>), String> {
        // `env` would take a program named NAME=VALUE for a variable.
        if program.contains('=') {
            return Err(format!("{program}: a program name cannot hold '='"));
        }
        // Outside the sandbox nothing tells a missing program apart from
        // one that failed: say it as a failed start does without one.
        if !program.contains('/') {
            let path = w.env.get("PATH").map_or(WORKER_PATH, String::as_str);
            if find_program(program, path).is_none() {
                return Err(format!(
                    "{program}: not found on the worker's PATH ({path})"
                ));
            }
        }
        let mut cmd = std::process::Command::new(&tools.bwrap);
        // bubblewrap and setpriv run as root: with the agent's minimal
        // environment, never the job's.
        cmd.env_clear()
            .env("PATH", WORKER_PATH)
            .env("LANG", "C.UTF-8");
        cmd.args(["--ro-bind", "/", "/", "--dev", "/dev"]);
        for dev in self.gpu_devices(w.gpus) {
            cmd.arg("--dev-bind").arg(&dev).arg(&dev);
        }
        cmd.args(["--proc", "/proc"]);
        cmd.args(["--perms", "1777", "--tmpfs", "/tmp"]);
        cmd.args(["--perms", "1777", "--tmpfs", "/dev/shm"]);
        for hidden in &self.hide {
            cmd.arg("--tmpfs").arg(hidden);
        }
        let binds: Vec<(&Path, bool)> = (self.binds.iter())
            .map(|b| (b.path.as_path(), b.writable))
            .chain(std::iter::once((w.dir, true)))
            .chain(w.writable.iter().map(|d| (*d, true)))
            .chain(w.readable.iter().map(|d| (*d, false)))
            .collect();
        // Where a bind lands inside an empty tmpfs, the directories on the
        // way are made crossable (bubblewrap would make them 0700).
        let mut made = std::collections::BTreeSet::new();
        for (path, _) in &binds {
            for dir in self.dirs_on_the_way(path) {
                if made.insert(dir.clone()) {
                    cmd.args(["--perms", "0711", "--dir"]).arg(&dir);
                }
            }
        }
        for (path, writable) in binds {
            cmd.arg(if writable { "--bind" } else { "--ro-bind" })
                .arg(path)
                .arg(path);
        }
        cmd.args([
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-cgroup-try",
            "--new-session",
            "--die-with-parent",
        ]);
        cmd.arg("--chdir").arg(w.dir);
        cmd.args(["--info-fd", &INFO_FD.to_string(), "--"]);
        cmd.arg(&tools.setpriv)
            .arg(format!("--reuid={}", user.uid))
            .arg(format!("--regid={}", user.gid))
            .args([
                "--clear-groups",
                "--no-new-privs",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]);
        cmd.arg(&tools.env).arg("-i");
        for (k, v) in &w.env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(program).args(args);
        let info = SandboxInfo::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
        let write_fd = info.write.as_ref().map(AsRawFd::as_raw_fd).unwrap_or(-1);
        // SAFETY: dup2 and fcntl are async-signal-safe; the fd is open
        // until the spawn returns (`info` outlives it).
        unsafe {
            cmd.pre_exec(move || {
                if write_fd == INFO_FD {
                    let flags = libc::fcntl(INFO_FD, libc::F_GETFD);
                    if flags < 0
                        || libc::fcntl(INFO_FD, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(write_fd, INFO_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok((cmd, Some(info)))
    }

    /// The directories between the tmpfs `path` lands in (a hidden path,
    /// or `/tmp`) and `path`, outermost first: inside the sandbox they do
    /// not exist until made.
    fn dirs_on_the_way(&self, path: &Path) -> Vec<PathBuf> {
        let tmp = Path::new("/tmp");
        let Some(root) = (self.hide.iter().map(PathBuf::as_path))
            .chain(std::iter::once(tmp))
            .find(|h| path.starts_with(h) && path != *h)
        else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = path
            .ancestors()
            .skip(1)
            .take_while(|a| *a != root)
            .map(Path::to_path_buf)
            .collect();
        dirs.reverse();
        dirs
    }

    /// The device nodes of `gpus` and the driver's shared ones.
    fn gpu_devices(&self, gpus: &[u32]) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia-caps",
            "/dev/infiniband",
        ]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
        match &self.gpu_minors {
            Some(minors) => out.extend(
                gpus.iter()
                    .filter_map(|g| minors.get(g))
                    .map(|m| PathBuf::from(format!("/dev/nvidia{m}")))
                    .filter(|p| p.exists()),
            ),
            None => {
                if let Ok(entries) = std::fs::read_dir("/dev") {
                    let mut all: Vec<PathBuf> = entries
                        .flatten()
                        .filter(|e| {
                            e.file_name().to_str().is_some_and(|n| {
                                n.strip_prefix("nvidia").is_some_and(|d| {
                                    !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                                })
                            })
                        })
                        .map(|e| e.path())
                        .collect();
                    all.sort();
                    out.extend(all);
                }
            }
        }
        out
    }
}

/// `program args` in the worker's directory with only its environment.
fn plain_command(w: &WorkerLaunch<'_>, program: &str, args: &[String]) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).env_clear().envs(&w.env).current_dir(w.dir);
    cmd
}

/// What a worker is started with.
#[derive(Debug)]
pub(crate) struct WorkerLaunch<'a> {
    pub command: &'a [String],
    /// The whole environment.
    pub env: BTreeMap<String, String>,
    /// Where it runs: its own, writable.
    pub dir: &'a Path,
    /// More of its own directories (its checkpoints).
    pub writable: Vec<&'a Path>,
    /// What it may read (the checkpoint it restores from).
    pub readable: Vec<&'a Path>,
    pub gpus: &'a [u32],
}

/// The fd bubblewrap writes its sandbox's first process to.
const INFO_FD: i32 = 3;

/// The pipe bubblewrap reports its sandbox on: `{"child-pid": N, …}`, the
/// sandbox's first process (its init, pid 1 inside) as the agent sees it.
#[derive(Debug)]
pub(crate) struct SandboxInfo {
    read: OwnedFd,
    write: Option<OwnedFd>,
}

impl SandboxInfo {
    fn pipe() -> io::Result<SandboxInfo> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two fds into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both fds were just opened and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(SandboxInfo {
            read,
            write: Some(write),
        })
    }

    /// The sandbox's init, once bubblewrap has made it; `None` when it
    /// failed first. Call after the spawn: closes the agent's write end.
    pub async fn child_pid(mut self) -> Option<u32> {
        drop(self.write.take());
        let read = self.read;
        let text = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut text = String::new();
                // Only bubblewrap holds the write end: the sandbox's
                // processes never get it.
                let _ = std::fs::File::from(read)
                    .take(4096)
                    .read_to_string(&mut text);
                text
            }),
        )
        .await
        .ok()?
        .ok()?;
        let info: serde_json::Value = serde_json::from_str(&text).ok()?;
        info.get("child-pid")?
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
    }
}

/// The user name the agent creates for `tenant`: `gw-{tenant}`, or, when
/// that is longer than the 32 characters a user name may have, a prefix
/// of it and a hash of the whole.
pub(crate) fn tenant_user_name(tenant: &str) -> String {
    let name = format!("gw-{tenant}");
    if name.len() <= 32 {
        return name;
    }
    format!(
        "gw-{}-{:08x}",
        &tenant[..20],
        gangway_shared::ids::short_hash(tenant.as_bytes())
    )
}

/// Looks `tenant`'s system user up, creating it first if it is missing.
fn ensure_tenant_user(tenant: &str) -> Result<RunAs, String> {
    let name = tenant_user_name(tenant);
    if let Some(u) = lookup_user(&name).map_err(|e| format!("looking up user {name}: {e}"))? {
        return Ok(u);
    }
    let out = std::process::Command::new("useradd")
        .env("PATH", WORKER_PATH)
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
        ])
        .arg(format!("Gangway tenant {tenant}"))
        .arg(&name)
        .output()
        .map_err(|e| format!("cannot run useradd to create user {name}: {e}"))?;
    // 9: it exists (another agent made it meanwhile).
    if !out.status.success() && out.status.code() != Some(9) {
        return Err(format!(
            "useradd {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    tracing::info!(tenant, user = %name, "created the tenant's system user");
    lookup_user(&name)
        .map_err(|e| format!("looking up user {name}: {e}"))?
        .ok_or_else(|| format!("useradd made no user {name}"))
}

fn check_unprivileged(u: &RunAs) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let agent = unsafe { libc::geteuid() };
    if u.uid == 0 || u.gid == 0 {
        return Err(format!("{} is root: workers never run as root", u.name));
    }
    if u.uid == agent {
        return Err(format!(
            "{} is the agent's own user: workers never run as it",
            u.name
        ));
    }
    Ok(())
}

/// A user of the system by name.
pub(crate) fn lookup_user(name: &str) -> io::Result<Option<RunAs>> {
    let cname = CString::new(name).map_err(|_| io::Error::other("a user name holds NUL"))?;
    // SAFETY: passwd is plain data; getpwnam_r fills it and points its
    // strings into `buf`, which outlives every use below.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        );
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        if result.is_null() {
            return Ok(None);
        }
        Ok(Some(RunAs {
            name: name.to_string(),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        }))
    }
}

/// The outermost ancestor of `path` (or `path` itself) that others may
/// not cross, and its mode.
fn unreachable_ancestor(path: &Path) -> Option<(PathBuf, u32)> {
    path.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find_map(|p| {
            let mode = std::fs::metadata(p).ok()?.permissions().mode();
            (mode & 0o001 == 0).then(|| (p.to_path_buf(), mode & 0o7777))
        })
}

/// GPU index → device minor number, from NVML where it loads.
fn nvml_minors() -> Option<BTreeMap<u32, u32>> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let count = nvml.device_count().ok()?;
    (0..count)
        .map(|i| {
            let minor = nvml.device_by_index(i).ok()?.minor_number().ok()?;
            Some((i, minor))
        })
        .collect()
}

/// Makes `dir` `user`'s own (0700) and every directory between `base`
/// and it the agent's, crossable but not listable (0711). `base` exists.
/// Without a user, only creates it.
pub(crate) fn own_dir(base: &Path, dir: &Path, user: Option<&RunAs>) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let Some(user) = user else { return Ok(()) };
    let rel = dir.strip_prefix(base).map_err(|_| {
        io::Error::other(format!("{} is not under {}", dir.display(), base.display()))
    })?;
    let mut at = base.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = std::fs::symlink_metadata(&at)?;
        if !meta.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                at.display()
            )));
        }
        if i + 1 < parts.len() {
            // The agent's: workers of other tenants cross it too.
            if meta.uid() != 0 {
                return Err(io::Error::other(format!(
                    "{} belongs to uid {}, not the agent",
                    at.display(),
                    meta.uid()
                )));
            }
            std::fs::set_permissions(&at, PermissionsExt::from_mode(0o711))?;
        } else {
            std::os::unix::fs::lchown(&at, Some(user.uid), Some(user.gid))?;
            std::fs::set_permissions(&at, PermissionsExt::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Gives the tree at `dir` (the agent wrote it; nobody else can have
/// touched it) to `user`, following no symbolic link.
pub(crate) fn give_tree(dir: &Path, user: &RunAs) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    std::os::unix::fs::lchown(dir, Some(user.uid), Some(user.gid))?;
    if meta.is_dir() {
        std::fs::set_permissions(dir, PermissionsExt::from_mode(0o700))?;
        for entry in std::fs::read_dir(dir)? {
            give_tree(&entry?.path(), user)?;
        }
    }
    Ok(())
}

/// Opens a worker's log for appending, refusing a symbolic link in its
/// place (the worker owns the directory it is in), and gives it to `user`.
pub(crate) fn open_log(path: &Path, user: Option<&RunAs>) -> io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if let Some(user) = user {
        std::os::unix::fs::fchown(&file, Some(user.uid), Some(user.gid))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests;
