//! One throwaway cluster per test process, and a fresh database per test.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::cluster::{block_on_private_runtime, PgCluster, PgOptions};

/// Parent of the per-process cluster directories. Fixed (not `$TMPDIR`)
/// because the server user must be able to traverse it when we are root.
pub const TEST_ROOT: &str = "/tmp";

/// Per-process directory name: `gangway-devkit-pg-<pid>-<nanos>`.
const DIR_PREFIX: &str = "gangway-devkit-pg-";

static CLUSTER: OnceLock<std::result::Result<TestCluster, String>> = OnceLock::new();
static NEXT_DB: AtomicU64 = AtomicU64::new(1);

/// The test process's cluster: fast settings, free port, under
/// `/tmp/gangway-devkit-pg-<pid>-*`. The postmaster is a child of a dedicated
/// thread with PR_SET_PDEATHSIG, so it dies when the test process does, even
/// on SIGKILL; on a normal exit an `atexit` hook also stops it and removes
/// the directory. Directories of dead test processes are swept at creation.
#[derive(Debug)]
pub struct TestCluster {
    cluster: PgCluster,
    root: PathBuf,
}

impl TestCluster {
    pub fn cluster(&self) -> &PgCluster {
        &self.cluster
    }

    pub fn port(&self) -> u16 {
        self.cluster.port()
    }

    /// Directory holding `data/` (removed at process exit).
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    pub fn connection_string(&self, db: &str) -> String {
        self.cluster.connection_string(db)
    }

    /// Creates an empty database named `<prefix>_<n>` (unique in this
    /// process, hence in this cluster); returns its connection string.
    pub async fn fresh_database(&self, prefix: &str) -> Result<String> {
        let name = unique_db_name(prefix);
        self.cluster.create_database(&name).await?;
        Ok(self.cluster.connection_string(&name))
    }
}

/// The process's test cluster, started on first use (about a second).
///
/// # Panics
/// When the cluster cannot be made (the message says why, e.g. how to
/// install PostgreSQL).
pub async fn test_cluster() -> &'static TestCluster {
    try_test_cluster().await.unwrap_or_else(|e| panic!("{e:#}"))
}

/// [`test_cluster`] returning the error instead of panicking.
pub async fn try_test_cluster() -> Result<&'static TestCluster> {
    if let Some(made) = CLUSTER.get() {
        return as_result(made);
    }
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::spawn_blocking(try_test_cluster_blocking)
            .await
            .map_err(|e| anyhow!("test cluster setup panicked: {e}"))?
    } else {
        try_test_cluster_blocking()
    }
}

/// [`test_cluster`] for synchronous code.
pub fn test_cluster_blocking() -> &'static TestCluster {
    try_test_cluster_blocking().unwrap_or_else(|e| panic!("{e:#}"))
}

/// [`test_cluster_blocking`] returning the error instead of panicking. A
/// failure is remembered: later calls fail at once with the same message.
pub fn try_test_cluster_blocking() -> Result<&'static TestCluster> {
    as_result(CLUSTER.get_or_init(|| make_test_cluster().map_err(|e| format!("{e:#}"))))
}

fn as_result(
    made: &'static std::result::Result<TestCluster, String>,
) -> Result<&'static TestCluster> {
    made.as_ref()
        .map_err(|e| anyhow!("the devkit test PostgreSQL cluster could not start: {e}"))
}

/// A new empty database in the process's test cluster; returns its
/// connection string (`host=127.0.0.1 port=N user=postgres dbname=<prefix>_<n>`).
///
/// Makes a fresh connection on the caller's runtime, so it is safe from any
/// number of `#[tokio::test]`s, each with its own runtime.
///
/// # Panics
/// When the cluster cannot start or the database cannot be created.
pub async fn fresh_database(prefix: &str) -> String {
    try_fresh_database(prefix)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// [`fresh_database`] returning the error instead of panicking.
pub async fn try_fresh_database(prefix: &str) -> Result<String> {
    try_test_cluster().await?.fresh_database(prefix).await
}

/// [`fresh_database`] for synchronous code.
pub fn fresh_database_blocking(prefix: &str) -> String {
    let cluster = test_cluster_blocking();
    block_on_private_runtime(|| cluster.fresh_database(prefix)).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `<prefix>_<n>`: the prefix lower-cased, other than `[a-z0-9_]` made `_`,
/// at most 40 characters, starting with a letter or `_`.
fn unique_db_name(prefix: &str) -> String {
    let mut base: String = prefix
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
        base.insert_str(0, "db_");
    }
    format!("{base}_{}", NEXT_DB.fetch_add(1, Ordering::Relaxed))
}

fn make_test_cluster() -> Result<TestCluster> {
    sweep_dead_dirs();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let root = Path::new(TEST_ROOT).join(format!("{DIR_PREFIX}{}-{nanos:08x}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(&root)
        .with_context(|| format!("creating {}", root.display()))?;
    // World-traversable whatever the umask, for the `postgres` user.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))?;
    let made =
        PgCluster::init_or_open(&root.join("data"), PgOptions::for_tests()).and_then(|mut c| {
            c.start()?;
            Ok(c)
        });
    match made {
        Ok(cluster) => {
            // SAFETY: registering a plain extern "C" fn.
            unsafe { libc::atexit(teardown_at_exit) };
            Ok(TestCluster { cluster, root })
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&root);
            Err(e)
        }
    }
}

extern "C" fn teardown_at_exit() {
    if let Some(Ok(tc)) = CLUSTER.get() {
        tc.cluster.kill_for_exit(Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&tc.root);
    }
}

/// Removes cluster directories of test processes that are gone and left no
/// running server behind (best effort).
fn sweep_dead_dirs() {
    let Ok(entries) = std::fs::read_dir(TEST_ROOT) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(DIR_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        if dir.join("data").join("postmaster.pid").exists() {
            continue;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_names() {
        let a = unique_db_name("My-Test.Name");
        assert!(a.starts_with("my_test_name_"), "{a}");
        let b = unique_db_name("9lives");
        assert!(b.starts_with("db_9lives_"), "{b}");
        assert_ne!(unique_db_name("x"), unique_db_name("x"));
        assert!(unique_db_name(&"a".repeat(100)).len() < 63);
    }
}
