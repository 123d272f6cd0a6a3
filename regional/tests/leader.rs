//! Several replicas of one region elect one scheduling leader through a
//! PostgreSQL advisory lock; when the leader goes, another takes over. When
//! the lock's session ends under a leader (its server failed over, or ended
//! the session), the leader stops leading at once, not at its next check.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gangway_regional::loops::scheduler::run_loop;
use gangway_regional::{AppState, RegionConfig};
use tokio_util::sync::CancellationToken;

async fn replica(url: &str) -> AppState {
    replica_checking_every(url, Duration::from_millis(50)).await
}

/// A replica whose leader checks its lock every `schedule_interval`.
async fn replica_checking_every(url: &str, schedule_interval: Duration) -> AppState {
    let mut cfg = RegionConfig::new("test", SocketAddr::from(([127, 0, 0, 1], 0)), url);
    cfg.leader_retry_interval = Duration::from_millis(50);
    cfg.schedule_interval = schedule_interval;
    gangway_regional::prepare(cfg, Duration::from_secs(10))
        .await
        .unwrap()
}

/// The leader's lock in `pg_locks` (key "gangway-leader", held by a
/// session, in this test's database), not the transactions' own advisory
/// locks nor another test's.
const LEADER_LOCK: &str = "locktype = 'advisory' AND granted AND objsubid = 1 \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND (classid::bigint << 32 | objid::bigint) = x'67616e676c656164'::bigint";

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_another_takes_over_when_it_goes() {
    let url = gangway_devkit::fresh_database("leader").await;
    let replicas = [
        replica(&url).await,
        replica(&url).await,
        replica(&url).await,
    ];
    let tokens: Vec<CancellationToken> =
        replicas.iter().map(|_| CancellationToken::new()).collect();
    let mut loops = Vec::new();
    for (r, t) in replicas.iter().zip(&tokens) {
        loops.push(tokio::spawn(run_loop(r.clone(), t.clone())));
    }
    let leaders = || replicas.iter().filter(|r| r.is_leader()).count();
    wait_until("a leader", || leaders() == 1).await;
    // It stays exactly one for a while.
    for _ in 0..20 {
        assert_eq!(leaders(), 1);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let first = replicas.iter().position(|r| r.is_leader()).unwrap();
    tokens[first].cancel();
    loops.remove(first).await.unwrap();
    wait_until("a new leader", || {
        replicas
            .iter()
            .enumerate()
            .any(|(i, r)| i != first && r.is_leader())
    })
    .await;
    assert_eq!(leaders(), 1);
    for t in &tokens {
        t.cancel();
    }
    for l in loops {
        l.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lock_session_ends_stops_leading_at_once_and_one_leads_after() {
    let url = gangway_devkit::fresh_database("leader_lost").await;
    // A leader checks its lock only every minute: stopping sooner can only
    // come from the lock's connection telling it.
    let every = Duration::from_secs(60);
    let replicas = [
        replica_checking_every(&url, every).await,
        replica_checking_every(&url, every).await,
    ];
    let tokens: Vec<CancellationToken> =
        replicas.iter().map(|_| CancellationToken::new()).collect();
    let mut loops = Vec::new();
    for (r, t) in replicas.iter().zip(&tokens) {
        loops.push(tokio::spawn(run_loop(r.clone(), t.clone())));
    }
    let leaders = || replicas.iter().filter(|r| r.is_leader()).count();
    wait_until("a leader", || leaders() == 1).await;
    let first = replicas.iter().position(|r| r.is_leader()).unwrap();

    // The server ends the lock holder's session, as a failover ends every
    // session of the old primary.
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let holder: i32 = admin
        .query_one(
            &format!("SELECT pid FROM pg_locks WHERE {LEADER_LOCK}"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let asked = Instant::now();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&holder])
        .await
        .unwrap();
    // Told by the connection itself: long before the minute's check.
    let deadline = Instant::now() + Duration::from_secs(20);
    while replicas[first].is_leader() && leaders() == 1 && Instant::now() < deadline {
        // Never two at once meanwhile.
        assert!(leaders() <= 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let noticed = asked.elapsed();
    assert!(
        noticed < every / 3,
        "the old leader was still leading {noticed:?} after its session ended"
    );
    // One replica leads again, on a new session, and only one.
    wait_until("a leader again", || leaders() == 1).await;
    for _ in 0..20 {
        assert_eq!(leaders(), 1);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let holders: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM pg_locks WHERE {LEADER_LOCK} AND pid <> $1"),
            &[&holder],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holders, 1, "exactly one session holds the lock");
    for t in &tokens {
        t.cancel();
    }
    for l in loops {
        l.await.unwrap();
    }
}
