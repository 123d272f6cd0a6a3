//! Checkpoints reported by agents: recorded once, refused from another
//! epoch, the newest being the highest (epoch, seq); and, with the region's
//! checkpoint store, recorded only when committed there.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::{job, node, register, store, submit, TIMING};
use gangway_regional::scheduling::run_pass;
use gangway_regional::store::{Recorded, Refusal};
use gangway_regional::{RegionConfig, Store};
use gangway_shared::agent::{
    Assignment, CheckpointRecord, RegisterRequest, SyncRequest, SyncResponse, WorkerReport,
    WorkerStatus,
};
use gangway_shared::api::JobState;
use uuid::Uuid;

const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

fn record(job_id: Uuid, epoch: i32, seq: u64, attempt: i32) -> CheckpointRecord {
    CheckpointRecord {
        job_id,
        epoch,
        seq,
        attempt,
        key: gangway_checkpoint::key(job_id, epoch, seq, attempt),
        name: format!("step-{seq}"),
        size_bytes: 100 * seq,
        files: 2,
        sha256: "ab".repeat(32),
        created_at: Utc::now(),
        node_id: "n0".into(),
        rank: 0,
    }
}

/// Syncs agent-0 with its running workers and these checkpoints.
async fn sync(
    store: &Store,
    boot: Uuid,
    running: &[Assignment],
    checkpoints: Vec<CheckpointRecord>,
) -> (Vec<Assignment>, Recorded) {
    let out = store
        .sync_agent(
            "agent-0",
            &SyncRequest {
                logs: Vec::new(),
                boot_id: boot,
                workers: running
                    .iter()
                    .map(|a| WorkerReport {
                        job_id: a.job_id,
                        rank: a.rank,
                        attempt: a.attempt,
                        status: WorkerStatus::Running,
                        // A path on the agent: local to it, not the restore point.
                        checkpoint: Some("/agent/checkpoints/step-9".into()),
                        fenced: false,
                        unasked: false,
                    })
                    .collect(),
                nodes: Vec::new(),
                checkpoints: Some(checkpoints),
            },
            TIMING,
        )
        .await
        .unwrap();
    (out.assignments, out.checkpoints)
}

#[tokio::test]
async fn checkpoints_are_recorded_once_the_newest_is_the_highest_epoch_and_seq_and_old_epochs_are_refused(
) {
    let (store, db) = store("ckpts").await;
    let boot = register(&store, vec![node("n0", "s0", "l0", "h100")]).await;
    let id = submit(&store, &job("acme", "h100", 8, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let (wanted, _) = sync(&store, boot, &[], vec![]).await;
    assert_eq!(wanted.len(), 1);
    assert_eq!(wanted[0].epoch, 1);
    assert_eq!(wanted[0].restore_from, None);

    // Seq 2 first: recorded, and the restore point; the worker's local path
    // (from an agent that uploads) is not.
    let (_, got) = sync(&store, boot, &wanted, vec![record(id, 1, 2, 1)]).await;
    assert_eq!(got.recorded, [record(id, 1, 2, 1).key]);
    let j = store.get_job("acme", id).await.unwrap();
    assert_eq!(j.restore_from, Some(record(id, 1, 2, 1).key));
    let c = j.checkpoint.expect("the newest checkpoint");
    assert_eq!((c.epoch, c.seq, c.size_bytes, c.files), (1, 2, 200, 2));
    assert_eq!(c.name, "step-2");
    assert_eq!(j.epoch, 1);

    // The same report again (a sync whose answer was lost): one row.
    let (_, got) = sync(&store, boot, &wanted, vec![record(id, 1, 2, 1)]).await;
    assert_eq!(got, Recorded::default());
    let rows: i64 = db
        .query_one("SELECT count(*) FROM checkpoints WHERE job_id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);

    // A lower seq arriving late is recorded but is not the newest; at the
    // same seq a later attempt is.
    let (_, got) = sync(&store, boot, &wanted, vec![record(id, 1, 1, 1)]).await;
    assert_eq!(got.recorded.len(), 1);
    let newest = |j: gangway_shared::api::Job| j.restore_from.unwrap();
    assert_eq!(
        newest(store.get_job("acme", id).await.unwrap()),
        record(id, 1, 2, 1).key
    );
    sync(&store, boot, &wanted, vec![record(id, 1, 2, 2)]).await;
    assert_eq!(
        newest(store.get_job("acme", id).await.unwrap()),
        record(id, 1, 2, 2).key
    );

    // A key that is not the canonical one for its fields is refused.
    let mut odd = record(id, 1, 7, 1);
    odd.key = format!("jobs/{id}/epoch-1/elsewhere");
    let (_, got) = sync(&store, boot, &wanted, vec![odd.clone()]).await;
    assert_eq!(got.refused, [(odd.key, Refusal::BadKey)]);

    // The job is adopted at epoch 2 (failover bumps it): a stale worker's
    // epoch-1 checkpoint is refused however high its seq, one of an epoch
    // the job never had too; an epoch-2 one wins over any epoch-1 seq.
    db.execute("UPDATE jobs SET epoch = 2 WHERE job_id = $1", &[&id])
        .await
        .unwrap();
    let (wanted, got) = sync(
        &store,
        boot,
        &wanted,
        vec![record(id, 1, 99, 1), record(id, 3, 1, 1)],
    )
    .await;
    assert_eq!(
        got.refused,
        [
            (record(id, 1, 99, 1).key, Refusal::StaleEpoch),
            (record(id, 3, 1, 1).key, Refusal::FutureEpoch)
        ]
    );
    assert_eq!(wanted[0].epoch, 2, "assignments carry the job's epoch");
    assert_eq!(
        newest(store.get_job("acme", id).await.unwrap()),
        record(id, 1, 2, 2).key
    );
    let (_, got) = sync(&store, boot, &wanted, vec![record(id, 2, 1, 1)]).await;
    assert_eq!(got.recorded.len(), 1);
    let j = store.get_job("acme", id).await.unwrap();
    assert_eq!(j.restore_from, Some(record(id, 2, 1, 1).key));
    assert_eq!(j.checkpoint.map(|c| (c.epoch, c.seq)), Some((2, 1)));
    assert_eq!(j.epoch, 2);

    // An unknown job's checkpoint is refused, and nothing else changes.
    let stray = record(Uuid::new_v4(), 1, 1, 1);
    let (_, got) = sync(&store, boot, &wanted, vec![stray.clone()]).await;
    assert_eq!(got.refused, [(stray.key, Refusal::UnknownJob)]);

    // Another tenant sees none of it.
    assert!(store.get_job("globex", id).await.is_err());

    // Preempted, the job requeues and its next start resumes from the
    // newest checkpoint's key.
    assert!(store.preempt_job(id, "test").await.unwrap());
    let (wanted, _) = sync(&store, boot, &[], vec![]).await;
    store
        .sync_agent(
            "agent-0",
            &SyncRequest {
                logs: Vec::new(),
                boot_id: boot,
                workers: vec![WorkerReport {
                    job_id: id,
                    rank: 0,
                    attempt: wanted[0].attempt,
                    status: WorkerStatus::Exited {
                        exit_code: Some(0),
                        signal: None,
                        message: Some("checkpointed and stopped".into()),
                    },
                    checkpoint: Some("/agent/checkpoints/step-10".into()),
                    fenced: false,
                    unasked: false,
                }],
                nodes: Vec::new(),
                checkpoints: Some(vec![]),
            },
            TIMING,
        )
        .await
        .unwrap();
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Queued
    );
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let (wanted, _) = sync(&store, boot, &[], vec![]).await;
    assert_eq!(wanted[0].restore_from, Some(record(id, 2, 1, 1).key));
}

#[tokio::test]
async fn with_a_checkpoint_store_the_region_records_only_what_is_committed_there() {
    let url = gangway_devkit::fresh_database("ckptstore").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ckpts = gangway_checkpoint::CheckpointStore::open("memory://").unwrap();
    let mut config = RegionConfig::new("test", addr, &url);
    config.checkpoint_store = Some(ckpts.clone());
    config.schedule_interval = Duration::from_millis(50);
    let state = gangway_regional::prepare(config, Duration::from_secs(10))
        .await
        .unwrap();
    let n0 = node("n0", "s0", "l0", "h100");
    let inventory = gangway_regional::store::InventoryNode::as_registered(&n0, "agent-0");
    state
        .store
        .load_inventory(&[inventory], "fleet")
        .await
        .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(
        listener,
        state,
        shutdown.clone(),
    ));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let boot = Uuid::new_v4();
    let r = http
        .post(format!("{base}/internal/v1/agents/register"))
        .json(&RegisterRequest {
            agent_id: "agent-0".into(),
            boot_id: boot,
            executor: "real".into(),
            nodes: vec![n0],
            host_id: None,
        })
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let tenant = gangway_shared::client::Client::new(base.clone(), "acme");
    let spec = serde_json::from_value(serde_json::json!({"name": "t", "gpus": 8,
        "gpu_type": "h100", "estimated_duration_s": 3600, "command": ["train"]}))
    .unwrap();
    let id = tenant.submit(&spec, None).await.unwrap().id;
    let sync = |checkpoints: Vec<CheckpointRecord>| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .post(format!("{base}/internal/v1/agents/agent-0/sync"))
                .json(&SyncRequest {
                    logs: Vec::new(),
                    boot_id: boot,
                    workers: vec![],
                    nodes: vec![],
                    checkpoints: Some(checkpoints),
                })
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.text().await.unwrap());
            r.json::<SyncResponse>().await.unwrap()
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sync(vec![]).await.assignments.is_empty() {
        assert!(std::time::Instant::now() < deadline, "never placed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("step-3");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("weights"), "3").unwrap();
    let up = |seq| gangway_checkpoint::Upload {
        job_id: id,
        epoch: 1,
        seq,
        attempt: 1,
        agent_id: "agent-0".into(),
        node_id: "n0".into(),
        rank: 0,
        owner: None,
    };
    let committed = ckpts.upload(&dir, &up(3)).await.unwrap().record();
    // Objects written, manifest never: not a checkpoint, whatever the
    // agent says.
    let partial = ckpts.upload_data(&dir, &up(4)).await.unwrap().record();
    // Committed, but the report says another digest.
    let mut lying = ckpts.upload(&dir, &up(5)).await.unwrap().record();
    lying.sha256 = "00".repeat(32);
    sync(vec![partial, lying, committed.clone()]).await;

    let j = tenant.get(id).await.unwrap();
    assert_eq!(j.restore_from, Some(committed.key.clone()));
    let c = j.checkpoint.expect("a checkpoint");
    assert_eq!((c.seq, c.size_bytes, c.files), (3, 1, 1));
    // Tenant-scoped: another tenant's view of it is a 404.
    let other = gangway_shared::client::Client::new(base.clone(), "globex");
    assert!(other.get(id).await.is_err());

    shutdown.cancel();
    let _ = server.await;
}
