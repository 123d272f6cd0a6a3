//! Running the server as user `postgres` when we are root (initdb and the
//! postmaster refuse to run as root).

use std::ffi::{CStr, CString};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The account the server runs as when the current process is root.
pub const SERVER_USER: &str = "postgres";

/// The identity that the server processes switch to.
#[derive(Clone, Debug)]
pub(crate) struct RunAs {
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
    pub runuser: Option<PathBuf>,
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl RunAs {
    /// `Some(postgres)` when running as root, `None` otherwise.
    pub fn for_current_process() -> Result<Option<Self>> {
        if !is_root() {
            return Ok(None);
        }
        Self::lookup(SERVER_USER).map(Some)
    }

    fn lookup(name: &str) -> Result<Self> {
        let cname = CString::new(name)?;
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: zeroed passwd is a valid out-parameter for getpwnam_r.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: all pointers are valid for the call; buf outlives the use of pwd.
        let rc = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc != 0 || result.is_null() {
            bail!(
                "running as root, so the PostgreSQL server must run as user `{name}` \
                 (initdb refuses to run as root), but there is no such user: install the \
                 `postgresql` package (`apt-get update && apt-get install -y postgresql`), \
                 which creates it, or run as a non-root user"
            );
        }
        let (uid, gid) = (pwd.pw_uid, pwd.pw_gid);
        let mut groups: Vec<libc::gid_t> = vec![0; 64];
        loop {
            let mut n = groups.len() as libc::c_int;
            // SAFETY: groups has room for n entries.
            let rc =
                unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
            if rc >= 0 {
                groups.truncate(n.max(0) as usize);
                break;
            }
            if groups.len() > 65536 {
                groups = vec![gid];
                break;
            }
            groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
        }
        let runuser = [
            "/usr/sbin/runuser",
            "/sbin/runuser",
            "/usr/bin/runuser",
            "/bin/runuser",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
        // SAFETY: pw_name points into buf, still alive.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) }
            .to_string_lossy()
            .into_owned();
        Ok(Self {
            name,
            uid,
            gid,
            groups,
            runuser,
        })
    }

    /// A command that runs `program` as this user: `runuser -u postgres -- program`
    /// when runuser exists, else a direct privilege drop in the child.
    pub fn command(&self, program: &Path) -> Command {
        match &self.runuser {
            Some(runuser) => {
                let mut cmd = Command::new(runuser);
                cmd.arg("-u").arg(&self.name).arg("--").arg(program);
                cmd
            }
            None => {
                let mut cmd = Command::new(program);
                self.drop_privileges_in_child(&mut cmd, None);
                cmd
            }
        }
    }

    /// Makes the child of `cmd` switch to this user before exec, and, when
    /// `death_signal` is set, ask the kernel to send it that signal when the
    /// spawning thread dies (PR_SET_PDEATHSIG must be set after the uid change,
    /// which clears it).
    pub fn drop_privileges_in_child(&self, cmd: &mut Command, death_signal: Option<libc::c_int>) {
        let (uid, gid, groups) = (self.uid, self.gid, self.groups.clone());
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure only makes async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                set_death_signal(death_signal, parent)
            });
        }
    }
}

/// Sets PR_SET_PDEATHSIG in a child between fork and exec (no uid change).
pub(crate) fn die_with_spawning_thread(cmd: &mut Command, signal: libc::c_int) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || set_death_signal(Some(signal), parent));
    }
}

fn set_death_signal(signal: Option<libc::c_int>, parent: libc::pid_t) -> std::io::Result<()> {
    if let Some(sig) = signal {
        // SAFETY: plain system calls.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("parent exited before exec"));
            }
        }
    }
    Ok(())
}

/// Whether the PostgreSQL server can reach `dir`: always when we do not
/// run as root (it runs as us), else when user `postgres` can traverse
/// every directory down to it (not a checkout under `/root`, say).
pub fn server_can_reach(dir: &Path) -> bool {
    match RunAs::for_current_process() {
        Ok(Some(user)) => check_traversable(dir, &user).is_ok(),
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Checks that `user` can traverse (search, `x`) every directory from `/`
/// down to `dir` itself. Ignores ACLs.
pub(crate) fn check_traversable(dir: &Path, user: &RunAs) -> Result<()> {
    let mut chain: Vec<&Path> = dir.ancestors().collect();
    chain.reverse();
    for d in chain {
        let meta = match std::fs::metadata(d) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("stat {}", d.display())),
        };
        let mode = meta.mode();
        let ok = if meta.uid() == user.uid {
            mode & 0o100 != 0
        } else if meta.gid() == user.gid || user.groups.contains(&meta.gid()) {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            bail!(
                "running as root, so the PostgreSQL server runs as user `{}` (initdb refuses \
                 to run as root), but `{}` cannot traverse directory {} (mode {:o}, owner uid {}) \
                 on the way to {}: put the data directory under a path such as /tmp or /var/tmp, \
                 or make {} traversable (chmod o+x {})",
                user.name,
                user.name,
                d.display(),
                mode & 0o7777,
                meta.uid(),
                dir.display(),
                d.display(),
                d.display()
            );
        }
    }
    Ok(())
}

/// chown `path` (recursively, without following symlinks) to `uid:gid`.
pub(crate) fn chown_recursive(path: &Path, uid: libc::uid_t, gid: libc::gid_t) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .with_context(|| format!("chown {} to uid {uid}", path.display()))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_recursive(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}
