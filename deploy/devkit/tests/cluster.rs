//! Real PostgreSQL clusters from the system binaries.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gangway_devkit::{fresh_database, test_cluster, PgCluster, PgOptions};
use tokio_postgres::NoTls;

/// A scratch directory under /tmp that the `postgres` user can traverse.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("gangway-devkit-it-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

async fn query_i64(conn: &str, sql: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(conn, NoTls).await.unwrap();
    tokio::spawn(connection);
    client.query_one(sql, &[]).await.unwrap().get(0)
}

fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next()),
            Some('Z') | Some('X')
        ),
        Err(_) => false,
    }
}

fn wait_dead(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while pid_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[tokio::test]
async fn start_create_connect_restart_keeps_data() {
    let dir = scratch();
    let data = dir.path().join("pg");
    let t0 = Instant::now();
    let mut pg = PgCluster::init_or_open(&data, PgOptions::for_tests()).unwrap();
    pg.start().unwrap();
    eprintln!("initdb + start: {:?}", t0.elapsed());
    assert!(pg.is_running());
    assert!(data.join("PG_VERSION").exists());

    pg.create_database("app").await.unwrap();
    pg.create_database("app").await.unwrap(); // idempotent
    let conn = pg.connection_string("app");
    let password = pg.password().expect("a new cluster has a password");
    assert_eq!(
        conn,
        format!(
            "host=127.0.0.1 port={} user=postgres password={password} dbname=app",
            pg.port()
        )
    );
    assert_eq!(query_i64(&conn, "SELECT 1::int8").await, 1);
    // Anything on the machine reaches 127.0.0.1 (a tenant's job, say):
    // without the password it is refused.
    let no_password = format!("host=127.0.0.1 port={} user=postgres dbname=app", pg.port());
    let refused = tokio_postgres::connect(&no_password, tokio_postgres::NoTls).await;
    assert!(refused.is_err(), "connected without the password");
    let key = std::fs::metadata(data.join(gangway_devkit::PASSWORD_FILE)).unwrap();
    assert_eq!(key.permissions().mode() & 0o777, 0o600);

    let client = pg.connect("app").await.unwrap();
    client
        .batch_execute("CREATE TABLE kept (v int8); INSERT INTO kept VALUES (42);")
        .await
        .unwrap();
    drop(client);

    pg.stop().unwrap();
    assert!(!pg.is_running());
    pg.stop().unwrap(); // idempotent
    assert!(!data.join("postmaster.pid").exists());

    let t1 = Instant::now();
    pg.start().unwrap();
    eprintln!("restart: {:?}", t1.elapsed());
    let conn = pg.connection_string("app");
    assert_eq!(query_i64(&conn, "SELECT v FROM kept").await, 42);

    // A new handle on the same directory (a `gangway dev up` restart) keeps it too.
    drop(pg);
    let mut again = PgCluster::init_or_open(&data, PgOptions::for_tests()).unwrap();
    again.start().unwrap();
    assert_eq!(
        query_i64(&again.connection_string("app"), "SELECT v FROM kept").await,
        42
    );
    let log = std::fs::read_to_string(again.log_file()).unwrap();
    assert!(log.contains("ready to accept connections"), "{log}");
}

#[tokio::test]
async fn fixed_port_and_socket_in_data_dir() {
    let dir = scratch();
    let port = gangway_devkit::free_port();
    let mut pg = PgCluster::init_or_open(
        &dir.path().join("d"),
        PgOptions {
            port: Some(port),
            ..PgOptions::for_tests()
        },
    )
    .unwrap();
    pg.start().unwrap();
    assert_eq!(pg.port(), port);
    assert!(pg.data_dir().join(format!(".s.PGSQL.{port}")).exists());
    let via_socket = format!(
        "host={} port={port} user=postgres dbname=postgres",
        pg.data_dir().display()
    );
    assert_eq!(query_i64(&via_socket, "SELECT 7::int8").await, 7);
}

#[tokio::test]
async fn stale_postmaster_pid_after_kill_child_mode() {
    let dir = scratch();
    let mut pg = PgCluster::init_or_open(&dir.path().join("pg"), PgOptions::for_tests()).unwrap();
    pg.start().unwrap();
    pg.create_database("s").await.unwrap();
    let pid = pg.postmaster_pid().unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_dead(pid, Duration::from_secs(10)));
    assert!(
        pg.data_dir().join("postmaster.pid").exists(),
        "stale pid file expected"
    );
    assert!(!pg.is_running());
    pg.start().unwrap();
    assert_ne!(pg.postmaster_pid(), Some(pid));
    assert_eq!(
        query_i64(&pg.connection_string("s"), "SELECT 1::int8").await,
        1
    );
}

#[tokio::test]
async fn stale_postmaster_pid_after_kill_daemon_mode() {
    let dir = scratch();
    let opts = PgOptions {
        die_with_parent: false,
        ..PgOptions::for_tests()
    };
    let mut pg = PgCluster::init_or_open(&dir.path().join("pg"), opts.clone()).unwrap();
    pg.start().unwrap();
    let pid = pg.postmaster_pid().unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_dead(pid, Duration::from_secs(10)));
    assert!(pg.data_dir().join("postmaster.pid").exists());
    pg.start().unwrap();
    assert_eq!(
        query_i64(&pg.connection_string("postgres"), "SELECT 1::int8").await,
        1
    );

    // A daemon left running by a detached handle is stopped and restarted
    // by the next handle on the directory.
    let old = pg.postmaster_pid().unwrap();
    pg.detach();
    drop(pg);
    assert!(pid_alive(old));
    let mut next = PgCluster::init_or_open(&dir.path().join("pg"), opts).unwrap();
    next.start().unwrap();
    assert!(!pid_alive(old));
    let new = next.postmaster_pid().unwrap();
    assert_ne!(new, old);
    drop(next);
    assert!(
        wait_dead(new, Duration::from_secs(10)),
        "drop must stop the daemon"
    );
}

#[tokio::test]
async fn fresh_databases_are_distinct_and_empty() {
    let t0 = Instant::now();
    let a = fresh_database("fresh").await;
    eprintln!(
        "first fresh_database (may include cluster start): {:?}",
        t0.elapsed()
    );
    let t1 = Instant::now();
    let b = fresh_database("fresh").await;
    eprintln!("second fresh_database: {:?}", t1.elapsed());
    assert_ne!(a, b);
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(query_i64(&a, tables).await, 0);
    {
        let (client, connection) = tokio_postgres::connect(&a, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE only_in_a (x int)")
            .await
            .unwrap();
    }
    assert_eq!(query_i64(&a, tables).await, 1);
    assert_eq!(query_i64(&b, tables).await, 0);
    let port = test_cluster().await.port();
    assert!(a.contains(&format!("port={port}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_database_from_another_runtime() {
    let mut names = Vec::new();
    for _ in 0..3 {
        names.push(fresh_database("Other Runtime!").await);
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3);
    assert!(names[0].contains("dbname=other_runtime__"), "{names:?}");
    assert_eq!(query_i64(&names[0], "SELECT 1::int8").await, 1);
}

#[test]
fn fresh_database_from_sync_code() {
    let conn = gangway_devkit::fresh_database_blocking("sync");
    assert!(conn.contains("dbname=sync_"));
}

#[test]
fn root_needs_a_traversable_parent() {
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gangway-devkit-closed-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let err = PgCluster::init_or_open(&dir.path().join("a/b/data"), PgOptions::for_tests())
        .unwrap_err()
        .to_string();
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(err.contains("/tmp or /var/tmp"), "{err}");
}

const CHILD_ENV: &str = "GANGWAY_DEVKIT_EXIT_CHILD";

/// Not a test on its own: the body of the child processes of
/// `test_cluster_dies_with_process`.
#[tokio::test]
async fn exit_child_helper() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let tc = test_cluster().await;
    let pid = tc.cluster().postmaster_pid().unwrap();
    println!("POSTMASTER={pid} ROOT={}", tc.root_dir().display());
    if mode == "hang" {
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
}

fn spawn_child(mode: &str) -> (std::process::Child, i32, PathBuf) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exit_child_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .find_map(|l| {
            let l = l.ok()?;
            // The harness prints "test exit_child_helper ... " on the same line.
            l.find("POSTMASTER=").map(|at| l[at..].to_owned())
        })
        .expect("child printed no POSTMASTER line");
    let mut parts = line.split_whitespace();
    let pid: i32 = parts.next().unwrap()["POSTMASTER=".len()..]
        .parse()
        .unwrap();
    let root = PathBuf::from(&parts.next().unwrap()["ROOT=".len()..]);
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, pid, root)
}

#[test]
fn test_cluster_dies_with_process() {
    // Normal exit: the atexit hook stops the server and removes the directory.
    let (mut child, pid, root) = spawn_child("exit");
    assert!(child.wait().unwrap().success());
    assert!(
        !pid_alive(pid),
        "postmaster {pid} outlived its test process"
    );
    assert!(!Path::new(&root).exists(), "{} left behind", root.display());

    // SIGKILL: the parent-death signal still takes the server down.
    let (mut child, pid, root) = spawn_child("hang");
    assert!(pid_alive(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_dead(pid, Duration::from_secs(15)),
        "postmaster {pid} outlived its SIGKILLed test process"
    );
    let _ = std::fs::remove_dir_all(root);
}
