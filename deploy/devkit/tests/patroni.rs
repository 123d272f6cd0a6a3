//! Real Patroni clusters (etcd, Patroni, PostgreSQL from the system
//! packages): replication, synchronous commits, failover, rejoin.
//!
//! They need `patroni` and `etcd-server` (`apt-get install -y patroni
//! etcd-server`); without them they fail, saying so.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use gangway_devkit::{PatroniCluster, PatroniOptions};
use tokio_postgres::{Client, NoTls};

/// Generous: a loaded 2-core CI machine runs these beside other tests.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
const REJOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A scratch directory under /tmp that the `postgres` user can traverse.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("gangway-devkit-patroni-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

fn start(dir: &tempfile::TempDir, scope: &str) -> PatroniCluster {
    let t0 = Instant::now();
    let opts = PatroniOptions {
        scope: scope.into(),
        start_timeout: START_TIMEOUT,
        ..PatroniOptions::for_tests()
    };
    let cluster = PatroniCluster::start(&dir.path().join("ha"), opts)
        .unwrap_or_else(|e| panic!("starting the Patroni cluster: {e:#}"));
    eprintln!("{scope}: 3 members ready in {:?}", t0.elapsed());
    cluster
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn count(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0)
}

/// Polls `member` until it has `n` rows in `t`.
async fn wait_rows(cluster: &PatroniCluster, member: &str, n: i64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match connect(&cluster.member_url(member, "app")).await {
            Ok(c) => match c.query_one("SELECT count(*) FROM t", &[]).await {
                Ok(row) if row.get::<_, i64>(0) == n => return,
                Ok(row) => last = format!("{} rows", row.get::<_, i64>(0)),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{member} did not reach {n} rows within {timeout:?} (last: {last})");
}

#[test]
fn starts_replicates_and_commits_synchronously() {
    let dir = scratch();
    let cluster = start(&dir, "repl");
    let primary = cluster.primary().expect("a primary once ready");
    let standbys: Vec<String> = (cluster.member_names().into_iter())
        .filter(|m| *m != primary)
        .collect();
    assert_eq!(standbys.len(), 2, "{standbys:?}");
    let sync = cluster
        .wait_for_sync_standby(Duration::from_secs(30))
        .unwrap();
    assert!(standbys.contains(&sync), "{sync} among {standbys:?}");
    assert_eq!(cluster.sync_standbys(), vec![sync.clone()]);
    cluster.create_database_blocking("app").unwrap();

    runtime().block_on(async {
        // The multi-host URL lands on the primary.
        let url = cluster.connection_url("app");
        assert!(url.contains("target_session_attrs=read-write"), "{url}");
        let c = connect(&url).await.unwrap();
        let in_recovery: bool = c
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .unwrap()
            .get(0);
        assert!(!in_recovery);
        let port: i32 = c
            .query_one("SELECT inet_server_port()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(port, i32::from(cluster.pg_port(&primary)));

        // Patroni made the standby synchronous.
        let names: String = c
            .query_one(
                "SELECT setting FROM pg_settings WHERE name = 'synchronous_standby_names'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            names.contains(&sync),
            "synchronous_standby_names = {names:?}"
        );
        let commit: String = c
            .query_one("SHOW synchronous_commit", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(commit, "on");
        let rows = c
            .query(
                "SELECT application_name, state, sync_state FROM pg_stat_replication",
                &[],
            )
            .await
            .unwrap();
        let repl: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        for s in &standbys {
            assert!(
                repl.iter().any(|r| &r.0 == s && r.1 == "streaming"),
                "{s} streams: {repl:?}"
            );
        }
        assert!(
            repl.iter().any(|r| r.0 == sync && r.2 == "sync"),
            "{sync} is sync: {repl:?}"
        );

        // A commit acknowledged with remote_apply is on the synchronous
        // standby the moment it returns.
        c.batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            .await
            .unwrap();
        c.batch_execute("SET synchronous_commit = remote_apply; INSERT INTO t VALUES (1, 'one')")
            .await
            .unwrap();
        let on_sync = connect(&cluster.member_url(&sync, "app")).await.unwrap();
        let standby: bool = on_sync
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .unwrap()
            .get(0);
        assert!(standby);
        assert_eq!(count(&on_sync).await, 1);
        // A plain synchronous commit reaches every standby soon after.
        c.batch_execute("SET synchronous_commit = on; INSERT INTO t VALUES (2, 'two')")
            .await
            .unwrap();
        for s in &standbys {
            wait_rows(&cluster, s, 2, Duration::from_secs(30)).await;
        }
        // Standbys refuse writes.
        let err = on_sync
            .batch_execute("INSERT INTO t VALUES (3, 'three')")
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION),
            "{err:?}"
        );
    });

    // A standby's postmaster killed: Patroni starts it again and it
    // streams again.
    let victim = standbys.iter().find(|s| **s != sync).unwrap().clone();
    let t0 = Instant::now();
    let pid = cluster.kill_postgres(&victim).unwrap();
    assert!(pid > 0);
    assert!(cluster.is_member_running(&victim));
    cluster.wait_for_standby(&victim, REJOIN_TIMEOUT).unwrap();
    eprintln!(
        "{victim}: PostgreSQL back and streaming in {:?}",
        t0.elapsed()
    );
    cluster.wait_ready(REJOIN_TIMEOUT).unwrap();
}

#[test]
fn failover_keeps_acknowledged_commits_and_the_old_primary_rejoins() {
    let dir = scratch();
    let cluster = start(&dir, "failover");
    cluster.create_database_blocking("app").unwrap();
    let url = cluster.connection_url("app");
    let old = cluster.primary().expect("a primary once ready");
    let rt = runtime();
    rt.block_on(async {
        let c = connect(&url).await.unwrap();
        c.batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            .await
            .unwrap();
        // Acknowledged: committed on the primary and flushed by its
        // synchronous standby.
        for i in 1..=10 {
            c.execute("INSERT INTO t VALUES ($1, 'before')", &[&i])
                .await
                .unwrap();
        }
    });

    // The primary's host dies.
    let t0 = Instant::now();
    cluster.kill_member(&old).unwrap();
    assert!(!cluster.is_member_running(&old));
    let new = cluster
        .wait_for_primary(Some(&old), FAILOVER_TIMEOUT)
        .unwrap();
    let failover = t0.elapsed();
    eprintln!("failover: {new} took over from {old} in {failover:?}");
    assert_ne!(new, old);

    rt.block_on(async {
        // The same multi-host URL reaches the new primary.
        let c = connect(&url).await.unwrap();
        let port: i32 = c
            .query_one("SELECT inet_server_port()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(port, i32::from(cluster.pg_port(&new)));
        // No acknowledged commit was lost.
        assert_eq!(count(&c).await, 10);
        c.execute("INSERT INTO t VALUES (11, 'after')", &[])
            .await
            .unwrap();
    });

    // The old primary comes back: it rejoins as a standby (pg_rewind when
    // it diverged) and gets the rows written meanwhile.
    let t1 = Instant::now();
    cluster.restart_member(&old).unwrap();
    cluster.wait_for_standby(&old, REJOIN_TIMEOUT).unwrap();
    eprintln!("{old} rejoined as a standby in {:?}", t1.elapsed());
    assert_eq!(cluster.primary().as_deref(), Some(new.as_str()));
    rt.block_on(async {
        let c = connect(&cluster.member_url(&old, "app")).await.unwrap();
        let standby: bool = c
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .unwrap()
            .get(0);
        assert!(standby, "{old} came back as a standby");
        wait_rows(&cluster, &old, 11, Duration::from_secs(30)).await;
    });
    cluster.wait_for_sync_standby(REJOIN_TIMEOUT).unwrap();
    cluster.wait_ready(REJOIN_TIMEOUT).unwrap();
}

#[test]
fn dropping_the_cluster_kills_every_process_and_removes_its_directory() {
    let dir = scratch();
    let root = dir.path().join("ha");
    let opts = PatroniOptions {
        scope: "drop".into(),
        members: 1,
        start_timeout: START_TIMEOUT,
        ..PatroniOptions::for_tests()
    };
    let cluster = PatroniCluster::start(&root, opts).unwrap();
    let member = cluster.member_names().remove(0);
    let pid_file = cluster.member_dir(&member).join("data/postmaster.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));
    assert!(!root.join("x").exists());
    // Not empty any more: a second cluster refuses the directory.
    let err = PatroniCluster::start(&root, PatroniOptions::for_tests()).unwrap_err();
    assert!(format!("{err:#}").contains("not empty"), "{err:#}");
    drop(cluster);
    assert!(!alive(pid), "the postmaster {pid} outlived the cluster");
    assert!(!root.exists());
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next()),
            Some('Z') | Some('X')
        ),
        Err(_) => false,
    }
}
