//! Replication's side that talks to other regions (docs/failover.md): a
//! new job's intent handed to a buddy, a dead region's jobs adopted, the
//! moves a majority recorded learned, checkpoints copied to a buddy's
//! store; and [`outbox`], what the leader keeps its peers told of later.
//! What is written and read in the database for all of it is in
//! `store/replicas.rs`, `store/handovers.rs` and the other store files;
//! this layer calls them and the peers ([`peers::Peers`]), never the
//! other way round.

pub mod intents;
pub mod outbox;
pub mod peers;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use uuid::Uuid;

use gangway_checkpoint::CheckpointStore;

use crate::store::replicas::{Intent, Leases, Move, MoveAnswer, MovesList, MovesQuery};
use crate::store::Store;
use crate::store::{Result, StoreError};
use intents::{IntentBatcher, Taken};
use peers::Peers;

/// What replication works with: this region's database, its link to the
/// other regions, its queues of intents for them, and its checkpoint store
/// — a view of the replica's state (`AppState::link`), so that this layer
/// needs nothing above it.
#[derive(Clone, Copy)]
pub struct Link<'a> {
    pub store: &'a Store,
    pub peers: &'a Arc<Peers>,
    pub intents: &'a Arc<IntentBatcher>,
    pub checkpoint_store: Option<&'a CheckpointStore>,
}

/// Hands `job`'s intent to its first buddy that takes it; then the job is
/// acknowledged and schedulable. Returns the buddy, or `None` when none
/// took it. A region without peers needs none.
pub async fn replicate_intent(link: Link<'_>, job: Uuid) -> Result<Option<String>> {
    let intent = link.store.intent_of(job).await?;
    hand_over(link, intent).await
}

/// [`replicate_intent`] of an intent the caller has (a create's own): it
/// goes with whatever else waits for the same buddy (`intents`, group
/// commit), and the job is marked held here.
pub async fn hand_over(link: Link<'_>, intent: Intent) -> Result<Option<String>> {
    let job = intent.job_id;
    match link.intents.hold(link.store, link.peers, intent).await {
        Taken::Marked(buddy) => Ok(Some(buddy)),
        // Held there, but the batch's mark failed: this job's own, so that
        // its error is the caller's.
        Taken::Unmarked(buddy) => {
            link.store.replicated(job, &buddy).await?;
            Ok(Some(buddy))
        }
        Taken::Nobody => Ok(None),
    }
}

/// Hands buddies the intents they do not hold yet (jobs whose create was
/// not acknowledged in time); what they are told later goes through
/// `crate::replication::outbox`.
pub async fn replicate_pending_intents(link: Link<'_>) {
    match link.store.awaiting_buddy(100).await {
        Ok(jobs) => {
            // All at once, so that those for one buddy go together.
            let sends = jobs.iter().map(|job| replicate_intent(link, *job));
            for (job, r) in jobs.iter().zip(futures_util::future::join_all(sends).await) {
                if let Err(e) = r {
                    tracing::warn!(error = %e, job_id = %job, "replicating an intent failed");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the jobs awaiting a buddy"),
    }
}

/// Adopts the live jobs of every region that a majority of regions has
/// not heard from for `adopt_after`, judged on `leases` (read after this
/// beat's heartbeats). Returns how many were adopted.
pub async fn adopt_dead(link: Link<'_>, leases: &Leases) -> Result<usize> {
    let peers = link.peers;
    let cfg = &peers.config;
    let adopt_after = peers.adopt_after.as_secs_f64();
    let me = link.store.region().to_string();
    let (silences, views, ages) = (&leases.silent_s, &leases.views, &leases.round_trip_s);
    let mut adopted = 0;
    for home in link.store.replica_homes().await? {
        if silences.get(&home).is_none_or(|s| *s < adopt_after) {
            continue;
        }
        // Regions that agree the home is silent: us, and peers we reach
        // now whose latest word says they have not heard it either.
        let agree = 1
            + (cfg.peers.iter().zip(ages))
                .filter(|(p, age)| {
                    p.name != home && age.is_some_and(|a| a < cfg.lease.as_secs_f64())
                })
                .filter(|(p, _)| {
                    (views.get(&p.name))
                        .and_then(|v| v.get(&home))
                        .is_some_and(|s| *s >= adopt_after)
                })
                .count();
        if agree < cfg.majority() {
            continue;
        }
        for (intent, checkpoint, checkpointed_at) in link.store.live_replicas(&home).await? {
            let m = Move {
                job_id: intent.job_id,
                from_home: home.clone(),
                to_region: me.clone(),
                epoch: intent.epoch + 1,
                planned: false,
                at: None,
            };
            // Recorded at a majority (us included) before it runs here.
            let mut recorded = usize::from(link.store.witness_move(&m, adopt_after).await?);
            for p in cfg.peers.iter().filter(|p| p.name != home) {
                let answer: std::result::Result<MoveAnswer, _> =
                    peers.post(&p.name, "/internal/v1/replicas/moves", &m).await;
                if answer.is_ok_and(|a| a.recorded) {
                    recorded += 1;
                }
            }
            if recorded < cfg.majority() {
                tracing::warn!(job_id = %m.job_id, recorded, "a move was not recorded at a majority: not adopted yet");
                continue;
            }
            let checkpoint = resumable_here(link, checkpoint).await;
            // The home's placements of it we hold as open are closed first
            // (billed if the home never comes back; docs/billing.md).
            let resumed_from = checkpoint.as_ref().and(checkpointed_at);
            let closed = (link.store)
                .close_placements(intent.job_id, &home, intent.epoch, resumed_from)
                .await?;
            if closed > 0 {
                tracing::info!(job_id = %intent.job_id, home, hours = closed, "closed the home's open placements of an adopted job");
            }
            link.store.adopt(&intent, checkpoint.as_deref()).await?;
            // Its intent goes to a buddy of ours at once, so it is
            // scheduled now (and survives our own failure next).
            replicate_intent(link, intent.job_id).await?;
            metrics::counter!("gangway_jobs_adopted_total").increment(1);
            adopted += 1;
        }
    }
    Ok(adopted)
}

/// The checkpoint a job moved here can resume from: only one this
/// region's store holds (a copy that never arrived, or a store-less
/// region, means the job starts over rather than failing to start); a
/// checkpoint that is no store key (a simulated executor's) as it is.
pub(crate) async fn resumable_here(link: Link<'_>, checkpoint: Option<String>) -> Option<String> {
    match (checkpoint, link.checkpoint_store) {
        (Some(c), Some(store)) if gangway_checkpoint::is_store_key(&c) => {
            store.manifest(&c).await.ok().map(|_| c)
        }
        (Some(c), _) if gangway_checkpoint::is_store_key(&c) => None,
        (c, _) => c,
    }
}

/// Asks the regions of our new majority which of our jobs moved while we
/// were cut off, and releases those. Fails (so we stay fenced) unless a
/// majority, us included, answered.
pub async fn learn_moves(link: Link<'_>) -> Result<usize> {
    let peers = link.peers;
    let q = MovesQuery {
        home: link.store.region().to_string(),
    };
    // Each peer gets the beat's patience to answer: one whose packets
    // vanish (a cut link answers nothing, not even a refusal) must not
    // keep the region fenced while a majority has answered.
    let patience = crate::loops::beat::peer_patience(&peers.config);
    let calls = peers.config.peers.iter().map(|p| {
        let q = &q;
        async move {
            let call = peers.post::<_, MovesList>(&p.name, "/internal/v1/replicas/moves/list", q);
            tokio::time::timeout(patience, call).await
        }
    });
    let mut answered = 1;
    let mut moves: BTreeMap<Uuid, Move> = BTreeMap::new();
    for r in futures_util::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .flatten()
    {
        answered += 1;
        for m in r.moves {
            match moves.get_mut(&m.job_id) {
                Some(k) if k.epoch == m.epoch => {
                    k.at = match (k.at, m.at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Some(k) if k.epoch > m.epoch => {}
                _ => {
                    moves.insert(m.job_id, m);
                }
            }
        }
    }
    if answered < peers.config.majority() {
        return Err(StoreError::Conflict {
            code: gangway_shared::error::codes::UNAVAILABLE,
            message: format!(
                "only {answered} region(s) answered which jobs moved; a majority is {}",
                peers.config.majority()
            ),
        });
    }
    let moves: Vec<Move> = moves.into_values().collect();
    let homes: BTreeSet<&str> = moves.iter().map(|m| m.to_region.as_str()).collect();
    let n = link.store.release_moved(&moves).await?;
    if n > 0 {
        tracing::warn!(jobs = n, to = ?homes, "jobs moved while this region was cut off");
    }
    Ok(n)
}

/// Bytes of a checkpoint file sent in one request.
const COPY_CHUNK: usize = 8 * 1024 * 1024;

/// Where a region stages what is copied in or out of its checkpoint store:
/// the process's own (two regions of one name on a machine — a test's
/// clouds — must not write into each other's files).
pub fn staging_root(region: &str, way: &str) -> std::path::PathBuf {
    let pid = std::process::id();
    std::env::temp_dir().join(format!("gangway-{region}-{pid}-checkpoints-{way}"))
}

/// Copies the checkpoint `key` from this region's store to `buddy`'s: the
/// files in chunks (`POST /internal/v1/replicas/checkpoints/file`), then
/// the manifest (`…/commit`), which the buddy commits only once every
/// file matches it. A buddy that refuses it (no store, an older epoch than
/// its copy of the job) counts as done: nothing more can be sent. Without
/// a store here there is nothing to copy.
pub async fn copy_checkpoint(
    link: Link<'_>,
    buddy: &str,
    key: &str,
) -> std::result::Result<(), String> {
    let Some(store) = link.checkpoint_store else {
        return Ok(());
    };
    let root = staging_root(link.store.region(), "out").join(Uuid::new_v4().simple().to_string());
    let result = async {
        let m = store.manifest(key).await.map_err(|e| e.to_string())?;
        let dir = root.join(&m.name);
        store.fetch(key, &dir).await.map_err(|e| e.to_string())?;
        for f in &m.files {
            // Read and sent a chunk at a time, so a large shard never sits
            // in memory whole.
            use tokio::io::AsyncReadExt;
            let local = f.path.split('/').fold(dir.clone(), |p, c| p.join(c));
            let mut file = tokio::fs::File::open(&local)
                .await
                .map_err(|e| e.to_string())?;
            let mut offset: u64 = 0;
            loop {
                let mut chunk = Vec::with_capacity(COPY_CHUNK);
                (&mut file)
                    .take(COPY_CHUNK as u64)
                    .read_to_end(&mut chunk)
                    .await
                    .map_err(|e| e.to_string())?;
                let n = chunk.len() as u64;
                let query = [
                    ("key", key.to_string()),
                    ("name", m.name.clone()),
                    ("path", f.path.clone()),
                    ("offset", offset.to_string()),
                ];
                let path = "/internal/v1/replicas/checkpoints/file";
                (link.peers.post_bytes(buddy, path, &query, chunk))
                    .await
                    .map_err(|e| e.to_string())?;
                offset += n;
                // An empty file is sent once, as an empty chunk.
                if n < COPY_CHUNK as u64 || offset >= f.size {
                    break;
                }
            }
        }
        let committed: std::result::Result<serde_json::Value, _> = link
            .peers
            .post(buddy, "/internal/v1/replicas/checkpoints/commit", &m)
            .await;
        match committed {
            Ok(_) => {
                metrics::counter!("gangway_checkpoints_replicated_total").increment(1);
                Ok(())
            }
            Err(peers::PeerError::Refused { status, body, .. }) if status < 500 => {
                tracing::warn!(
                    key,
                    buddy,
                    status,
                    body,
                    "the buddy refused a checkpoint copy"
                );
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }
    .await;
    let _ = tokio::fs::remove_dir_all(&root).await;
    result
}
