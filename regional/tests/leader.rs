//! Several replicas of one region elect one scheduling leader through a
//! PostgreSQL advisory lock; when the leader goes, another takes over.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gangway_regional::loops::scheduler::run_loop;
use gangway_regional::{AppState, RegionConfig};
use tokio_util::sync::CancellationToken;

async fn replica(url: &str) -> AppState {
    let mut cfg = RegionConfig::new("test", SocketAddr::from(([127, 0, 0, 1], 0)), url);
    cfg.leader_retry_interval = Duration::from_millis(50);
    cfg.schedule_interval = Duration::from_millis(50);
    gangway_regional::prepare(cfg, Duration::from_secs(10))
        .await
        .unwrap()
}

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
