//! [`Backups`]: a pgBackRest repository (a directory) and stanza for one
//! [`PgCluster`]: continuous WAL archiving, base backups, and restores into
//! a new data directory to the end of the archive or to a point in time.
//!
//! ```no_run
//! # fn demo() -> anyhow::Result<()> {
//! use gangway_devkit::{Backups, BackupKind, PgCluster, PgOptions, RestoreTarget};
//! let backups = Backups::new("/var/tmp/b/backups".as_ref(), "region-a", "/var/tmp/b/pg".as_ref())?;
//! let mut pg = PgCluster::init_or_open(
//!     "/var/tmp/b/pg".as_ref(),
//!     backups.archive_options(PgOptions::default()),
//! )?;
//! pg.start()?;
//! backups.stanza_create(&pg)?;
//! backups.check(&pg)?;
//! backups.backup(&pg, BackupKind::Full)?;
//! // … later: the state as of a time, in a new data directory, promoted.
//! let restored = backups.restore(
//!     &RestoreTarget::Time("2026-11-03 10:15:00+00".into()),
//!     "/var/tmp/b/pg-restored".as_ref(),
//!     PgOptions::default(),
//! )?;
//! # Ok(()) }
//! ```
//!
//! pgBackRest runs with `--config=<dir>/pgbackrest.conf` always (never
//! `/etc/pgbackrest.conf`), as user `postgres` when this process is root,
//! with the repository, logs and locks under `dir`, owned by that user.

use std::fs::DirBuilder;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cluster::{
    block_on_private_runtime, PgCluster, PgOptions, LOG_FILE_NAME, PASSWORD_FILE, SUPERUSER,
};
use crate::user::{check_traversable, chown_recursive, RunAs};

/// What to install when `pgbackrest` is missing.
pub const PGBACKREST_INSTALL_HINT: &str = "apt-get update && apt-get install -y pgbackrest";

/// Name of the pgBackRest configuration file, in a [`Backups`] directory.
pub const PGBACKREST_CONFIG_FILE: &str = "pgbackrest.conf";

/// The superuser's password of the backed-up cluster, kept beside the
/// repository (readable by this process's user alone): the cluster's own
/// copy ([`PASSWORD_FILE`]) is root's and left out of the backups, and a
/// restored cluster gets this one.
const KEPT_PASSWORD: &str = "superuser.password";

/// Environment variables that would redirect libpq inside pgBackRest.
const SCRUBBED_PG_ENV: [&str; 7] = [
    "PGDATA",
    "PGPORT",
    "PGHOST",
    "PGHOSTADDR",
    "PGUSER",
    "PGDATABASE",
    "PGOPTIONS",
];

/// Which backup [`Backups::backup`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupKind {
    /// Every file (`--type=full`).
    Full,
    /// What changed since the last full backup (`--type=diff`).
    Diff,
    /// What changed since the last backup of any kind (`--type=incr`).
    Incr,
}

impl BackupKind {
    fn as_arg(self) -> &'static str {
        match self {
            BackupKind::Full => "--type=full",
            BackupKind::Diff => "--type=diff",
            BackupKind::Incr => "--type=incr",
        }
    }
}

/// How far [`Backups::restore`] replays the archived WAL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreTarget {
    /// To the end of the archive (`--type=default`): every transaction
    /// whose WAL reached the repository.
    Latest,
    /// To a point in time (`--type=time --target=… --target-action=promote`):
    /// every transaction committed at or before it, none after. A
    /// timestamp PostgreSQL reads, with its zone (e.g. the text of
    /// `SELECT now()`: `2026-11-03 10:15:00.123456+00`). WAL with a commit
    /// after it must be in the archive, or recovery stops short with an
    /// error; and a backup must have ended before it, by pgBackRest's
    /// clock in whole seconds (a target within 2 s of the only backup's end
    /// is refused: "unable to find backup set with stop time less than …").
    Time(String),
}

/// A pgBackRest repository in a directory, and one stanza in it for the
/// cluster in one data directory. Cheap to clone; holds no process.
#[derive(Clone, Debug)]
pub struct Backups {
    dir: PathBuf,
    stanza: String,
    pg_data: PathBuf,
    program: PathBuf,
    run_as: Option<RunAs>,
}

impl Backups {
    /// A repository under `dir` (created; `dir/repo`, with `dir/log` and
    /// `dir/lock`) for stanza `stanza` of the cluster whose data directory
    /// is (or will be) `pg_data`, and its configuration written to
    /// `dir/pgbackrest.conf`. Nothing runs yet: start the cluster with
    /// [`archive_options`](Self::archive_options), then
    /// [`stanza_create`](Self::stanza_create). Opening an existing `dir`
    /// again rewrites the configuration (e.g. for a restored cluster's new
    /// data directory: archiving then goes on in the same stanza).
    pub fn new(dir: &Path, stanza: &str, pg_data: &Path) -> Result<Self> {
        if stanza.is_empty()
            || !stanza
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!(
                "stanza name {stanza:?} must be non-empty ASCII letters, digits, `-`, `_` or `.`"
            );
        }
        let program = find_pgbackrest()?;
        let run_as = RunAs::for_current_process()?;
        let dir = resolve(dir)?;
        let pg_data = resolve(pg_data)?;
        for p in [&dir, &pg_data] {
            let s = p.to_string_lossy();
            if s.contains(['\n', '\r', '\'', '"', ' ']) {
                bail!("{s:?}: a path for pgBackRest may not hold quotes, spaces or newlines");
            }
        }
        if let Some(user) = &run_as {
            check_traversable(dir.parent().unwrap_or(Path::new("/")), user)?;
        }
        for sub in ["", "repo", "log", "lock", "spool"] {
            let d = if sub.is_empty() {
                dir.clone()
            } else {
                dir.join(sub)
            };
            if !d.exists() {
                DirBuilder::new()
                    .mode(0o700)
                    .create(&d)
                    .with_context(|| format!("creating {}", d.display()))?;
            }
        }
        let backups = Self {
            dir,
            stanza: stanza.to_owned(),
            pg_data,
            program,
            run_as,
        };
        let config = backups.config_file();
        let _ = std::fs::remove_file(&config);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&config)
            .and_then(|mut f| std::io::Write::write_all(&mut f, backups.config_text().as_bytes()))
            .with_context(|| format!("writing {}", config.display()))?;
        if let Some(user) = &backups.run_as {
            // The repository is the server user's (archive-push runs as
            // it), all but the kept password, which stays ours.
            for entry in std::fs::read_dir(&backups.dir)? {
                let path = entry?.path();
                if path.file_name() != Some(KEPT_PASSWORD.as_ref())
                    && std::fs::symlink_metadata(&path)?.uid() != user.uid
                {
                    chown_recursive(&path, user.uid, user.gid)?;
                }
            }
            std::os::unix::fs::chown(&backups.dir, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {} to {}", backups.dir.display(), user.name))?;
        }
        Ok(backups)
    }

    /// The pgBackRest configuration written for this repository.
    fn config_text(&self) -> String {
        let d = |sub: &str| self.dir.join(sub).to_string_lossy().into_owned();
        let data = self.pg_data.to_string_lossy();
        format!(
            "# Written by gangway-devkit; use with --config={config}.\n\
             [global]\n\
             repo1-path={repo}\n\
             repo1-retention-full=2\n\
             log-path={log}\n\
             lock-path={lock}\n\
             spool-path={spool}\n\
             log-level-console=warn\n\
             log-level-stderr=off\n\
             log-level-file=detail\n\
             compress-type=lz4\n\
             start-fast=y\n\
             archive-timeout=60\n\
             \n\
             [global:backup]\n\
             exclude={PASSWORD_FILE}\n\
             exclude={LOG_FILE_NAME}\n\
             \n\
             [{stanza}]\n\
             pg1-path={data}\n\
             pg1-socket-path={data}\n\
             pg1-user={SUPERUSER}\n",
            config = self.config_file().display(),
            repo = d("repo"),
            log = d("log"),
            lock = d("lock"),
            spool = d("spool"),
            stanza = self.stanza,
        )
    }

    /// The server settings that archive every WAL segment into this
    /// repository: `archive_mode=on`, `wal_level=replica` and
    /// `archive_command='pgbackrest --config=… --stanza=… archive-push %p'`.
    pub fn archive_settings(&self) -> Vec<(String, String)> {
        let command = format!(
            "{} {} --stanza={} archive-push %p",
            sh_quote(&self.program.to_string_lossy()),
            sh_quote(&format!("--config={}", self.config_file().display())),
            self.stanza
        );
        vec![
            ("wal_level".into(), "replica".into()),
            ("archive_mode".into(), "on".into()),
            ("archive_command".into(), command),
        ]
    }

    /// `opts` with [`archive_settings`](Self::archive_settings) added to
    /// its [`PgOptions::extra_settings`].
    pub fn archive_options(&self, mut opts: PgOptions) -> PgOptions {
        opts.extra_settings.extend(self.archive_settings());
        opts
    }

    /// `pgbackrest stanza-create` for the running cluster `pg` (which must
    /// archive with [`archive_settings`](Self::archive_settings)); also
    /// keeps its superuser password for restores. Fine to repeat.
    pub fn stanza_create(&self, pg: &PgCluster) -> Result<()> {
        self.keep_password(pg)?;
        self.run_on(pg, &["stanza-create"], "stanza-create")
            .map(drop)
    }

    /// `pgbackrest check`: the cluster archives into the repository. It
    /// switches to a new WAL segment and waits until the one switched from
    /// is archived — so everything committed before the call can be
    /// restored; call it to make sure of that (or `pg_switch_wal()` and wait).
    pub fn check(&self, pg: &PgCluster) -> Result<()> {
        self.run_on(pg, &["check"], "check").map(drop)
    }

    /// `pgbackrest backup --type=full|diff|incr` of the running cluster
    /// (`start-fast=y`: it checkpoints at once). Returns pgBackRest's output.
    pub fn backup(&self, pg: &PgCluster, kind: BackupKind) -> Result<String> {
        self.keep_password(pg)?;
        self.run_on(pg, &[kind.as_arg(), "backup"], "backup")
    }

    /// `pgbackrest info`: the backups and the archived WAL, as text.
    pub fn info(&self) -> Result<String> {
        self.run(&["info"], "info")
    }

    /// Restores the newest backup that fits `target` into `data_dir` (a new
    /// or empty directory; never an existing cluster), opens it as a
    /// [`PgCluster`] with `opts`, starts it and waits until it has replayed
    /// the archived WAL to `target` and promoted itself (accepts writes).
    ///
    /// `opts` without [`archive_settings`](Self::archive_settings) gives a
    /// cluster that archives nothing; to archive the restored cluster into
    /// this repository (on its new timeline), open a `Backups` on the same
    /// directory and stanza for `data_dir`, and pass its options.
    pub fn restore(
        &self,
        target: &RestoreTarget,
        data_dir: &Path,
        opts: PgOptions,
    ) -> Result<PgCluster> {
        let data_dir = resolve(data_dir)?;
        if data_dir == self.pg_data {
            bail!(
                "{} is the backed-up cluster's own data directory; restore into a new one",
                data_dir.display()
            );
        }
        if data_dir.exists() {
            let empty = std::fs::read_dir(&data_dir)
                .with_context(|| format!("reading {}", data_dir.display()))?
                .next()
                .is_none();
            if !empty {
                bail!(
                    "{} is not empty: restore into a new or empty directory",
                    data_dir.display()
                );
            }
        } else {
            DirBuilder::new()
                .mode(0o700)
                .create(&data_dir)
                .with_context(|| format!("creating {}", data_dir.display()))?;
        }
        if let Some(user) = &self.run_as {
            check_traversable(data_dir.parent().unwrap_or(Path::new("/")), user)?;
            std::os::unix::fs::chown(&data_dir, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {} to {}", data_dir.display(), user.name))?;
        }
        let kept = self.dir.join(KEPT_PASSWORD);
        let password = std::fs::read_to_string(&kept).with_context(|| {
            format!(
                "reading the superuser password kept at {} (written by stanza_create/backup)",
                kept.display()
            )
        })?;
        let pg1_path = format!("--pg1-path={}", data_dir.display());
        let mut args: Vec<String> = vec![pg1_path];
        match target {
            RestoreTarget::Latest => args.push("--type=default".into()),
            RestoreTarget::Time(at) => {
                if at.trim().is_empty() || at.contains(['\n', '\r', '"', '\'']) {
                    bail!("{at:?} is not a usable recovery target time");
                }
                args.push("--type=time".into());
                args.push(format!("--target={at}"));
                args.push("--target-action=promote".into());
            }
        }
        args.push("restore".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args, "restore")?;
        write_private(&data_dir.join(PASSWORD_FILE), password.trim())?;

        let mut pg = PgCluster::init_or_open(&data_dir, opts)?;
        pg.start().with_context(|| {
            format!(
                "starting the cluster restored into {} (target {target:?})",
                data_dir.display()
            )
        })?;
        wait_promoted(&pg)?;
        tracing::info!(
            data_dir = %data_dir.display(),
            stanza = %self.stanza,
            ?target,
            "restored PostgreSQL cluster from pgBackRest"
        );
        Ok(pg)
    }

    /// The directory holding the repository, configuration and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The repository (`repo1-path`).
    pub fn repo_dir(&self) -> PathBuf {
        self.dir.join("repo")
    }

    /// pgBackRest's own logs, one file per stanza and command.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// The configuration file every command is given (`--config`).
    pub fn config_file(&self) -> PathBuf {
        self.dir.join(PGBACKREST_CONFIG_FILE)
    }

    pub fn stanza(&self) -> &str {
        &self.stanza
    }

    /// The backed-up cluster's data directory (`pg1-path`).
    pub fn pg_data(&self) -> &Path {
        &self.pg_data
    }

    fn keep_password(&self, pg: &PgCluster) -> Result<()> {
        let Some(password) = pg.password() else {
            bail!(
                "{} has no superuser password file ({PASSWORD_FILE}): a restored copy could \
                 not be connected to",
                pg.data_dir().display()
            );
        };
        let kept = self.dir.join(KEPT_PASSWORD);
        if std::fs::read_to_string(&kept)
            .ok()
            .as_deref()
            .map(str::trim)
            != Some(password)
        {
            write_private(&kept, password)?;
        }
        Ok(())
    }

    /// Runs a command that talks to the running cluster `pg`.
    fn run_on(&self, pg: &PgCluster, args: &[&str], what: &str) -> Result<String> {
        if pg.data_dir() != self.pg_data {
            bail!(
                "pgbackrest {what}: the cluster in {} is not this stanza's ({})",
                pg.data_dir().display(),
                self.pg_data.display()
            );
        }
        if !pg.is_running() {
            bail!(
                "pgbackrest {what}: the cluster in {} is not running",
                pg.data_dir().display()
            );
        }
        let socket = pg.data_dir().join(format!(".s.PGSQL.{}", pg.port()));
        if !socket.exists() {
            bail!(
                "pgbackrest {what}: the cluster in {} has no unix socket ({}), which pgBackRest \
                 connects through; use a shorter data directory path and \
                 PgOptions::unix_socket",
                pg.data_dir().display(),
                socket.display()
            );
        }
        let port = format!("--pg1-port={}", pg.port());
        let mut all = vec![port.as_str()];
        all.extend_from_slice(args);
        self.run(&all, what)
    }

    /// Runs `pgbackrest --config=… --stanza=… ARGS` (as the server user
    /// when root); the error quotes its output.
    fn run(&self, args: &[&str], what: &str) -> Result<String> {
        let mut cmd = match &self.run_as {
            Some(user) => user.command(&self.program),
            None => Command::new(&self.program),
        };
        // Progress on our commands' output (quoted on failure); the
        // server's archive-push/archive-get log warnings alone.
        cmd.arg(format!("--config={}", self.config_file().display()))
            .arg(format!("--stanza={}", self.stanza))
            .arg("--log-level-console=info")
            .args(args)
            .current_dir("/")
            .stdin(Stdio::null());
        for var in SCRUBBED_PG_ENV {
            cmd.env_remove(var);
        }
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("PGBACKREST_") {
                cmd.env_remove(var);
            }
        }
        let started = Instant::now();
        let out = cmd
            .output()
            .with_context(|| format!("running {} {what}", self.program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let said = format!("{}\n{}", stdout.trim(), stderr.trim());
            bail!(
                "pgbackrest {what} (stanza {}, --config={}) failed ({}):\n{}\n(its log: {})",
                self.stanza,
                self.config_file().display(),
                out.status,
                tail(said.trim(), 40),
                self.log_dir()
                    .join(format!("{}-{what}.log", self.stanza))
                    .display()
            );
        }
        tracing::debug!(what, stanza = %self.stanza, elapsed = ?started.elapsed(), "pgbackrest done");
        Ok(stdout.into_owned())
    }
}

/// Waits until the just-started restored cluster has left recovery
/// (a hot standby accepts read-only connections before it promotes).
fn wait_promoted(pg: &PgCluster) -> Result<()> {
    let deadline = Instant::now() + pg.options().start_timeout.max(Duration::from_secs(10));
    block_on_private_runtime(|| async {
        loop {
            let in_recovery = match pg.connect("postgres").await {
                Ok(client) => client
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .await
                    .map(|row| row.get::<_, bool>(0))
                    .map_err(anyhow::Error::from),
                Err(e) => Err(e),
            };
            match in_recovery {
                Ok(false) => return Ok(()),
                Ok(true) | Err(_) if pg.is_running() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                result => bail!(
                    "the cluster restored into {} did not finish recovery ({}); last lines of {}:\n{}",
                    pg.data_dir().display(),
                    match result {
                        Ok(_) => "still in recovery at the deadline".to_owned(),
                        Err(e) if pg.is_running() => format!("{e:#}"),
                        Err(_) => "the server exited".to_owned(),
                    },
                    pg.log_file().display(),
                    pg.log_tail(30)
                ),
            }
        }
    })
}

/// `pgbackrest` on PATH, else /usr/bin/pgbackrest.
fn find_pgbackrest() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("pgbackrest"))
        .chain([PathBuf::from("/usr/bin/pgbackrest")])
        .find(|p| p.is_absolute() && p.is_file());
    on_path.with_context(|| {
        format!("pgbackrest is not installed (not on PATH nor /usr/bin): run `{PGBACKREST_INSTALL_HINT}`")
    })
}

/// Absolute, with the parent (created) resolved, as [`PgCluster`] does.
fn resolve(path: &Path) -> Result<PathBuf> {
    let path =
        std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a usable directory", path.display()))?
        .to_owned();
    let parent = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let parent = parent
        .canonicalize()
        .with_context(|| format!("resolving {}", parent.display()))?;
    Ok(parent.join(name))
}

/// A new file at `path` that only its owner may read (replacing one there).
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

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_names_the_repository_the_stanza_and_the_cluster() {
        if find_pgbackrest().is_err() {
            eprintln!("skipped: pgbackrest is not installed ({PGBACKREST_INSTALL_HINT})");
            return;
        }
        let dir = tempfile::Builder::new()
            .prefix("gangway-devkit-backups-")
            .tempdir_in(crate::TEST_ROOT)
            .unwrap();
        // Traversable by the `postgres` user when the test runs as root.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let b = Backups::new(&root.join("b"), "region-a", &root.join("pg")).unwrap();
        let text = std::fs::read_to_string(b.config_file()).unwrap();
        for line in [
            format!("repo1-path={}/b/repo", root.display()),
            "[region-a]".to_owned(),
            format!("pg1-path={}/pg", root.display()),
            format!("exclude={PASSWORD_FILE}"),
            "start-fast=y".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
        let settings = b.archive_settings();
        let command = &settings
            .iter()
            .find(|(k, _)| k == "archive_command")
            .unwrap()
            .1;
        assert!(
            command.ends_with(&format!(
                "'--config={}/b/pgbackrest.conf' --stanza=region-a archive-push %p",
                root.display()
            )),
            "{command}"
        );
        assert!(Backups::new(&root.join("b"), "bad stanza", &root.join("pg")).is_err());

        // A restore without backups fails, quoting pgBackRest.
        let e = b
            .restore(
                &RestoreTarget::Latest,
                &root.join("r"),
                PgOptions::for_tests(),
            )
            .unwrap_err();
        assert!(format!("{e:#}").contains("superuser password"), "{e:#}");
        write_private(&b.dir().join(KEPT_PASSWORD), "x").unwrap();
        let e = b
            .restore(
                &RestoreTarget::Latest,
                &root.join("r"),
                PgOptions::for_tests(),
            )
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("pgbackrest restore") && e.contains("ERROR"),
            "{e}"
        );
    }
}
