//! Workers' output as agents ship it (`store/logs.rs`): kept once however
//! often it is sent, only from the agent whose node runs the worker, read
//! by the job's tenant alone, and bounded per job.

mod common;

use std::time::Duration;

use common::{job, node, store, submit, Fleet};
use gangway_regional::scheduling::run_pass;
use gangway_regional::store::StoreError;
use gangway_shared::agent::{LogChunk, LogStream};
use gangway_shared::api::JOB_LOG_LIMIT_BYTES;
use uuid::Uuid;

const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

fn chunk(job_id: Uuid, offset: u64, text: &str) -> LogChunk {
    LogChunk {
        job_id,
        rank: 0,
        attempt: 1,
        stream: LogStream::Stdout,
        offset,
        text: text.into(),
        len: text.len() as u64,
    }
}

#[tokio::test]
async fn output_is_kept_once_from_its_own_agent_and_read_by_its_tenant_alone() {
    let (store, _client) = store("logs").await;
    // Two machines of 8 GPUs, an agent each; one 8-GPU job lands on one.
    let fleet = Fleet::register_nodes(
        &store,
        vec![
            node("n0", "s0", "l0", "h100"),
            node("n1", "s0", "l0", "h100"),
        ],
    )
    .await;
    let id = submit(&store, &job("acme", "h100", 8, 8)).await;
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    let (mine, other) = if fleet.act(&store, 0, None).await.is_empty() {
        ("agent-n1", "agent-n0")
    } else {
        ("agent-n0", "agent-n1")
    };
    let hello = chunk(id, 0, "hello\n");
    assert_eq!(
        store
            .append_logs(mine, std::slice::from_ref(&hello))
            .await
            .unwrap(),
        0
    );
    // Sent again (a sync whose answer was lost): kept once.
    assert_eq!(
        store
            .append_logs(mine, std::slice::from_ref(&hello))
            .await
            .unwrap(),
        0
    );
    // The other machine's agent cannot write into this job, nor can one
    // name a job that does not exist.
    let forged = chunk(id, 6, "rm -rf your-model\n");
    assert_eq!(store.append_logs(other, &[forged]).await.unwrap(), 1);
    let nowhere = chunk(Uuid::new_v4(), 0, "x");
    assert_eq!(store.append_logs(mine, &[nowhere]).await.unwrap(), 1);
    store
        .append_logs(mine, &[chunk(id, 6, "world\n")])
        .await
        .unwrap();

    let logs = store.job_logs("acme", id, None, None, 0).await.unwrap();
    let text: String = logs.chunks.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(text, "hello\nworld\n");
    // Each chunk names the region that keeps it; the cursor is this
    // region's place.
    assert!(logs.chunks.iter().all(|c| c.region == store.region()));
    let last = logs.chunks.last().unwrap().seq;
    assert_eq!(logs.next_after, format!("{}:{last}", store.region()));
    assert_eq!((logs.kept_bytes, logs.dropped_bytes), (12, 0));
    assert!(!logs.finished);
    // Read on from a cursor: only what came after.
    let after = store
        .job_logs("acme", id, None, None, logs.chunks[0].seq)
        .await
        .unwrap();
    assert_eq!(after.chunks.len(), 1);
    assert_eq!(after.next_after, logs.next_after);
    // Another tenant: no such job.
    assert!(matches!(
        store.job_logs("globex", id, None, None, 0).await,
        Err(StoreError::NotFound)
    ));
    // Another rank: nothing.
    let rank1 = store.job_logs("acme", id, Some(1), None, 0).await.unwrap();
    assert!(rank1.chunks.is_empty());

    // Past the bound, output is counted, not kept.
    let big = "x".repeat(1024 * 1024);
    let mut offset = 12;
    while offset < JOB_LOG_LIMIT_BYTES + 2 * 1024 * 1024 {
        store
            .append_logs(mine, &[chunk(id, offset, &big)])
            .await
            .unwrap();
        offset += big.len() as u64;
    }
    let logs = store.job_logs("acme", id, None, None, 0).await.unwrap();
    assert!(
        logs.kept_bytes <= JOB_LOG_LIMIT_BYTES,
        "{}",
        logs.kept_bytes
    );
    assert!(
        logs.dropped_bytes >= 2 * 1024 * 1024,
        "{}",
        logs.dropped_bytes
    );
    assert_eq!(logs.kept_bytes + logs.dropped_bytes, offset);
}
