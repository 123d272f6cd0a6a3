//! PostgreSQL clusters from the system binaries, for `gangway dev up` (one
//! persistent private cluster per region under its state directory, resumed
//! on restart) and for tests (one throwaway cluster per test process, a fresh
//! empty database per test). No mocks: the real server, started in about a
//! second.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use gangway_devkit::{PgCluster, PgOptions};
//! let mut pg = PgCluster::init_or_open("/tmp/state/region-a/pg".as_ref(), PgOptions::default())?;
//! pg.start()?;
//! pg.create_database_blocking("gangway")?; // or `.create_database(..).await`
//! let conn = pg.connection_string("gangway"); // host=127.0.0.1 port=N user=postgres password=… dbname=gangway
//! # Ok(()) }
//! ```
//!
//! In tests:
//!
//! ```no_run
//! # async fn demo() {
//! let conn = gangway_devkit::fresh_database("my_test").await;
//! let (client, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls).await.unwrap();
//! # }
//! ```
//!
//! # Layout
//!
//! - `binaries` — [`PgBinaries::find`]: `initdb`, `pg_ctl` and `postgres` from
//!   `$GANGWAY_PG_BIN_DIR`, else the first `PATH` directory holding all three,
//!   else the newest `/usr/lib/postgresql/*/bin`; when missing, the error says
//!   to run `apt-get update && apt-get install -y postgresql` or to put the
//!   binaries on PATH.
//! - `user` — running as root: initdb/pg_ctl run as user `postgres` through
//!   `runuser -u postgres -- …` (the postmaster itself drops privileges
//!   between fork and exec), the data directory is created and chowned to
//!   `postgres`, and every directory above it must be traversable by
//!   `postgres` (else an error names the blocking directory and suggests
//!   /tmp or /var/tmp). Not root: everything runs as the current user.
//! - `cluster` — [`PgCluster`]: `init_or_open` (initdb `--auth=trust -U postgres
//!   --encoding=UTF8 --no-locale` only when `PG_VERSION` is absent, into a
//!   sibling directory renamed into place), `start` (127.0.0.1 only, a free
//!   port unless [`PgOptions::port`], unix socket in the data directory,
//!   `max_connections=200`, durability off only with [`PgOptions::fast`], log
//!   in `<data>/postgres.log`, waits until connections are accepted and
//!   quotes the log tail on failure; a stale `postmaster.pid` from a killed
//!   run is cleared, a live leftover server on the directory is stopped
//!   first), `stop` (`pg_ctl stop -m fast`, idempotent), `create_database`
//!   (idempotent), connection strings. Drop stops the server unless
//!   [`PgCluster::detach`] was called. By default
//!   ([`PgOptions::die_with_parent`]) the postmaster is a child of a
//!   dedicated thread with `PR_SET_PDEATHSIG`, so it never outlives this
//!   process; with `die_with_parent: false` it is a `pg_ctl start` daemon.
//! - `testing` — [`test_cluster`] / [`fresh_database`]: one cluster per test
//!   process under `/tmp/gangway-devkit-pg-<pid>-*`, created lazily, torn
//!   down by an `atexit` hook (and by the parent-death signal if the process
//!   is killed); each call of `fresh_database` creates a new empty database.
//!   Safe across parallel test binaries (own cluster, own port) and across
//!   `#[tokio::test]` runtimes (no connection is shared between runtimes).

mod binaries;
mod cluster;
mod testing;
mod user;

pub use binaries::{PgBinaries, DEBIAN_PG_LIB_ROOT, INSTALL_HINT, PG_BIN_DIR_ENV};
pub use cluster::{
    file_tail, free_port, quote_ident, PgCluster, PgOptions, LOG_FILE_NAME, PASSWORD_FILE,
    SUPERUSER,
};
pub use testing::{
    fresh_database, fresh_database_blocking, test_cluster, test_cluster_blocking,
    try_fresh_database, try_test_cluster, try_test_cluster_blocking, TestCluster, TEST_ROOT,
};
pub use user::{server_can_reach, SERVER_USER};
