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
//! - `patroni` — [`PatroniCluster`]: an HA cluster for tests and
//!   `gangway dev up --db ha` — one etcd and N (3) Patroni members
//!   `<scope>-db1…` on 127.0.0.1, `synchronous_mode`, pg_rewind, timers from
//!   [`PatroniOptions`] (`for_tests`: ttl 8 s), each process under a small
//!   Python supervisor (child subreaper; its stdin is a pipe from us) that
//!   SIGKILLs the process tree when this process goes; the multi-host
//!   `target_session_attrs=read-write` URL, Patroni's view over its REST API
//!   (`GET /cluster`, 2 s timeouts), waits that probe a real commit, and
//!   fault injection (`kill_postgres`, `kill_member`, `restart_member`).
//!   Needs the Debian packages `patroni` and `etcd-server`
//!   ([`PATRONI_INSTALL_HINT`]).
//! - `testing` — [`test_cluster`] / [`fresh_database`]: one cluster per test
//!   process under `/tmp/gangway-devkit-pg-<pid>-*`, created lazily, torn
//!   down by an `atexit` hook (and by the parent-death signal if the process
//!   is killed); each call of `fresh_database` creates a new empty database.
//!   Safe across parallel test binaries (own cluster, own port) and across
//!   `#[tokio::test]` runtimes (no connection is shared between runtimes).
//! - `backup` — [`Backups`]: a pgBackRest repository (a directory) and
//!   stanza for one cluster, its configuration in `<dir>/pgbackrest.conf`
//!   (always passed with `--config`), run as user `postgres` when root:
//!   [`Backups::archive_options`] (`archive_mode=on`, `archive_command` =
//!   `pgbackrest … archive-push %p`), `stanza_create`, `check` (switches
//!   WAL and waits until it is archived), `backup` ([`BackupKind`], fast
//!   checkpoint), `info`, and `restore` into a new data directory to
//!   [`RestoreTarget::Latest`] or [`RestoreTarget::Time`], which starts the
//!   restored cluster and waits until it has promoted. Errors quote
//!   pgBackRest's output.

mod backup;
mod binaries;
mod cluster;
mod patroni;
mod testing;
mod user;

pub use backup::{
    BackupKind, Backups, RestoreTarget, PGBACKREST_CONFIG_FILE, PGBACKREST_INSTALL_HINT,
};
pub use binaries::{PgBinaries, DEBIAN_PG_LIB_ROOT, INSTALL_HINT, PG_BIN_DIR_ENV};
pub use cluster::{
    file_tail, free_port, quote_ident, PgCluster, PgOptions, LOG_FILE_NAME, PASSWORD_FILE,
    SUPERUSER,
};
pub use patroni::{
    MemberStatus, PatroniCluster, PatroniHost, PatroniHosts, PatroniOptions, ETCD_BIN_ENV,
    ETCD_LOG_FILE, PATRONI_BIN_ENV, PATRONI_INSTALL_HINT, PATRONI_LOG_FILE, REPLICATION_USER,
};
pub use testing::{
    fresh_database, fresh_database_blocking, test_cluster, test_cluster_blocking,
    try_fresh_database, try_test_cluster, try_test_cluster_blocking, TestCluster, TEST_ROOT,
};
pub use user::{server_can_reach, SERVER_USER};
