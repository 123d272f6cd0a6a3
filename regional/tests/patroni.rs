//! A region whose database is a Patroni cluster (a primary and synchronous
//! standbys, coordinated through etcd) goes on through a failover: two
//! control-plane replicas on the cluster's multi-host URL, jobs submitted
//! all along, and the primary's member killed as its host would die. While
//! no primary takes writes a submission is refused only as `unavailable`
//! (503 with Retry-After, never a 500); then writes land on the new
//! primary through the same URL, every acknowledged job is there (the
//! standby was synchronous), and exactly one replica leads.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use gangway_devkit::{PatroniCluster, PatroniOptions};
use gangway_regional::loops::scheduler::run_loop;
use gangway_regional::store::SubmitOutcome;
use gangway_regional::{AppState, RegionConfig};
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn replica(url: &str) -> AppState {
    let mut cfg = RegionConfig::new("test", "127.0.0.1:0".parse().unwrap(), url);
    cfg.leader_retry_interval = Duration::from_millis(100);
    cfg.schedule_interval = Duration::from_millis(100);
    gangway_regional::prepare(cfg, Duration::from_secs(30))
        .await
        .unwrap()
}

async fn wait(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the submitter saw: acknowledged jobs (and when), refusals by kind.
#[derive(Default)]
struct Seen {
    acked: Vec<(Uuid, Instant)>,
    refused: Vec<String>,
    wrong: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_on_patroni_writes_to_the_new_primary_after_a_failover_and_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let cluster = tokio::task::spawn_blocking(move || {
        let c = PatroniCluster::start(&path, PatroniOptions::for_tests())?;
        c.create_database_blocking("gangway")?;
        anyhow::Ok(c)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("the Patroni cluster did not start: {e:#}"));
    let cluster = Arc::new(cluster);
    let url = cluster.connection_url("gangway");
    let replicas = [replica(&url).await, replica(&url).await];
    let stop = CancellationToken::new();
    let loops: Vec<_> = (replicas.iter())
        .map(|r| tokio::spawn(run_loop(r.clone(), stop.child_token())))
        .collect();
    let leaders = || replicas.iter().filter(|r| r.is_leader()).count();
    wait("a leader", Duration::from_secs(30), || leaders() == 1).await;

    // Submissions all along, through one replica's store, judged as the
    // API would answer them.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop_submitting = CancellationToken::new();
    let submitting = {
        let (store, seen, stop) = (
            replicas[0].store.clone(),
            seen.clone(),
            stop_submitting.clone(),
        );
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let job = common::job("acme", "h100", 8, 8);
                match store.submit(&job).await {
                    Ok(SubmitOutcome::Created(j)) => {
                        seen.lock().unwrap().acked.push((j.id, Instant::now()))
                    }
                    Ok(SubmitOutcome::Replayed(_)) => seen
                        .lock()
                        .unwrap()
                        .wrong
                        .push("a fresh job replayed".into()),
                    Err(e) => {
                        let what = e.to_string();
                        let api = ApiError::from(e);
                        let mut s = seen.lock().unwrap();
                        if api.status == StatusCode::SERVICE_UNAVAILABLE
                            && api.code == codes::UNAVAILABLE
                            && api.retry_after_s.is_some()
                        {
                            s.refused.push(what);
                        } else {
                            s.wrong.push(format!("{} {}: {what}", api.status, api.code));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    wait(
        "jobs acknowledged before the kill",
        Duration::from_secs(30),
        || seen.lock().unwrap().acked.len() >= 5,
    )
    .await;

    // The primary's host dies: Patroni, PostgreSQL, at once.
    let old = cluster.primary().expect("a primary before the kill");
    let killed = Instant::now();
    let c = cluster.clone();
    let o = old.clone();
    tokio::task::spawn_blocking(move || c.kill_member(&o))
        .await
        .unwrap()
        .unwrap();
    let c = cluster.clone();
    let o = old.clone();
    let new =
        tokio::task::spawn_blocking(move || c.wait_for_primary(Some(&o), Duration::from_secs(90)))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("no new primary: {e:#}"));
    assert_ne!(new, old);
    // Writes land again, through the same URL.
    let acked_after = |s: &Seen| s.acked.iter().filter(|(_, t)| *t > killed).count();
    wait(
        "jobs acknowledged after the failover",
        Duration::from_secs(60),
        || acked_after(&seen.lock().unwrap()) >= 5,
    )
    .await;
    stop_submitting.cancel();
    submitting.await.unwrap();
    // Exactly one replica leads afterwards: the old leader's lock died
    // with the old primary, and the replicas competed again on the new.
    wait(
        "one leader after the failover",
        Duration::from_secs(30),
        || leaders() == 1,
    )
    .await;
    for _ in 0..20 {
        assert_eq!(leaders(), 1);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.cancel();
    for l in loops {
        l.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.wrong.is_empty(),
        "refused other than as unavailable: {:?}",
        seen.wrong
    );
    let first_after = (seen.acked.iter())
        .find(|(_, t)| *t > killed)
        .map(|(_, t)| t.duration_since(killed));
    eprintln!(
        "failover {old} → {new}: {} acknowledged, {} refused as unavailable, first write after the kill at {first_after:?}",
        seen.acked.len(),
        seen.refused.len()
    );

    // Every acknowledged job is on the new primary (a fresh store on the
    // same URL reads it).
    let store = gangway_regional::Store::connect(&url, "test", 2).unwrap();
    for (id, _) in &seen.acked {
        store
            .get_job("acme", *id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {id} lost in the failover: {e}"));
    }
}
