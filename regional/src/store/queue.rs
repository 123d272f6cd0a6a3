//! Each pool's queue, kept between scheduling passes and brought up to date
//! by reading only the jobs that changed (issue 23).
//!
//! A pass used to read every queued job of its pool: at a few hundred
//! queued jobs that was a third of the database's time in a busy cloud,
//! and it grows with the queue. Now the first pass of a pool reads the
//! whole queue once; every later pass reads the jobs whose `queue_xid`
//! (V28: the transaction that last changed what the queue shows of a job)
//! is at or above the previous snapshot's xmin, drops them from what it
//! holds and adds back those still waiting. Every change the previous
//! snapshot did not see was made by a transaction at or above its xmin, so
//! nothing is missed; a change it already saw may be read again, which is
//! harmless. A deleted job leaves no row: deletions move
//! `sched_state.queue_epoch`, and a pass that sees it moved reads the whole
//! queue again.
//!
//! A job a buddy region does not hold yet (`jobs_awaiting_buddy`, V29) is
//! not placed, but is held apart: a buddy taking it deletes its row there
//! and touches nothing of the job that the queue's trigger watches (so the
//! mark stays a HOT update), so each read asks which of the held awaiting
//! jobs no longer await, and reads those again.
//!
//! The queue of a key is locked from before its snapshot is taken until
//! the snapshot is read, so the snapshots a key's state is brought up to
//! date with are taken one after the other (each sees at least what the
//! one before it saw). A read that fails leaves no state: the next one
//! reads the whole queue.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use gangway_sched::{QueueWindow, Request};
use tokio_postgres::Row;
use uuid::Uuid;

use super::plans::level_from_db;
use super::Result;

/// The queue's columns and conditions; the two reads give how `j` (a job)
/// and `ranks` (its pending workers' ranks, in order) are found.
macro_rules! queue_select {
    ($from:literal, $group:literal) => {
        concat!(
            "SELECT j.job_id, j.tenant, j.gpu_type, j.gpus_per_worker, j.priority, j.seq,
                    j.mode::text AS mode, j.required_level::text AS required,
                    j.preferred_level::text AS preferred, j.created_at,
                    j.estimated_duration_s, j.min_workers, j.requeue_front,
                    j.reservation_id, ranks,
                    -- Not acknowledged (nor placed) until a buddy region
                    -- holds its intent: held apart.
                    EXISTS (SELECT 1 FROM jobs_awaiting_buddy a WHERE a.job_id = j.job_id)
                        AS awaiting
             FROM ",
            $from,
            "
             WHERE j.state IN ('queued', 'starting', 'running')
               AND j.run_workers IS NULL AND ($1::text IS NULL OR j.gpu_type = $1)
               AND j.cluster_id IS NOT DISTINCT FROM $2
               -- Being handed to another region (evacuation.rs): never
               -- placed here again.
               AND j.handover_to IS NULL",
            $group
        )
    };
}

/// Every waiting job of a pool: the pending workers grouped by job, each
/// job then looked up by key (`OFFSET 0` keeps it a lookup). As a join,
/// the conditions on `jobs` (`cluster_id IS NOT DISTINCT FROM` above all)
/// were estimated at one row, and the planner grouped every pending worker
/// again for each job it scanned: 0.4 s at 1,080 queued jobs, 7.7 s at
/// 5,080 (`queue_depth` bench, the whole read).
const WHOLE_QUEUE: &str = queue_select!(
    "(SELECT w.job_id, array_agg(w.rank ORDER BY w.rank) AS ranks
                   FROM workers w WHERE w.state = 'pending' GROUP BY w.job_id) w
                  CROSS JOIN LATERAL (SELECT * FROM jobs j WHERE j.job_id = w.job_id OFFSET 0) j",
    ""
);
/// The waiting jobs among `$3` (no id twice): driven by the ids, a key
/// lookup of the job and of its pending workers each, whatever the
/// statistics say. As `j.job_id = ANY($3)` the planner, with statistics a
/// burst left stale (the pending workers taken for one row), scanned an
/// index of `jobs` for each pending worker and compared every id with
/// each row: 22.6 s for 300 changed jobs on 4,401 jobs (`EXPLAIN ANALYZE`
/// of the generic plan, docs/benchmarks-history.md). Joined with the ids
/// and grouped, its generic plan, made when few workers were pending,
/// walked every pending worker and compared it with every id: 9.4 ms for
/// 20 ids at 3,000 pending workers in a whole-cloud run, against 0.66 ms
/// this way (the `OFFSET 0` keeps the job's lookup a parameterised
/// index scan per id; the ranks' lookup is one by the lateral's nature).
const SOME_OF_THE_QUEUE: &str = queue_select!(
    "unnest($3::uuid[]) AS c(id)
             CROSS JOIN LATERAL (SELECT * FROM jobs j WHERE j.job_id = c.id OFFSET 0) j
             CROSS JOIN LATERAL (SELECT array_agg(w.rank ORDER BY w.rank) AS ranks
                                 FROM workers w
                                 WHERE w.job_id = j.job_id AND w.state = 'pending') w",
    "
               AND ranks IS NOT NULL"
);
/// The jobs whose queue entry changed at or after transaction `$1` (the
/// previous snapshot's xmin), before `$2` (this snapshot's xmax). The upper
/// bound changes nothing (a row this snapshot sees was written below its
/// xmax) but the plan: with `>=` alone and no statistics yet (a burst of
/// 50,000 jobs not yet analysed), the planner took a third of the table
/// for the answer and scanned all of it, 11–16 ms a read for 10 changed
/// jobs; a range it takes for a small share and reads the index.
const CHANGED: &str = "SELECT job_id FROM jobs
     WHERE queue_xid >= ($1::bigint)::text::xid8 AND queue_xid < ($2::bigint)::text::xid8";
/// Which of the jobs `$1` (held as awaiting a buddy) no longer await one.
const NO_LONGER_AWAITING: &str = "SELECT id FROM unnest($1::uuid[]) AS id
     WHERE NOT EXISTS (SELECT 1 FROM jobs_awaiting_buddy a WHERE a.job_id = id)";

/// Where a job sits in the queue's order: priority (high first), `seq`,
/// id.
type QueueKey = (std::cmp::Reverse<i32>, u64, Uuid);

/// One waiting job: what the core places (a gang is one request, an array
/// job's workers one each) and when it was submitted.
#[derive(Clone, Debug)]
struct Queued {
    requests: Vec<Request>,
    submitted_at: DateTime<Utc>,
}

/// A pool's queue as of one snapshot.
#[derive(Debug, Default)]
pub(super) struct QueueState {
    /// `sched_state.queue_epoch` at that snapshot.
    epoch: i64,
    /// That snapshot's xmin.
    xmin: i64,
    /// The jobs that may be placed, in queue order (priority, then `seq`):
    /// a pass's copy of the units is made in that order, so the planner,
    /// which walks them in about that order, finds them side by side in
    /// memory (at 50,000 queued jobs, copied in id order, the plan took
    /// 1.8× as long).
    jobs: BTreeMap<QueueKey, Queued>,
    /// Each job's key in `jobs`.
    key_of: HashMap<Uuid, QueueKey>,
    /// Each tenant's keys in `jobs`, in queue order (the window's tenant
    /// part).
    by_tenant: HashMap<String, BTreeSet<QueueKey>>,
    /// Units in `jobs` per GPU type (the queue's depth, window or not).
    pub(super) units: BTreeMap<String, u64>,
    /// The pool's jobs that would wait but for a buddy region to hold them.
    awaiting: HashSet<Uuid>,
}

impl QueueState {
    /// The fewest GPUs a waiting unit needs to start (its smallest start:
    /// all its workers', or an elastic gang's fewest); `None`: nothing
    /// waits.
    pub(super) fn smallest_start(&self) -> Option<u64> {
        (self.jobs.values())
            .flat_map(|q| &q.requests)
            .map(Request::min_gpus)
            .min()
    }

    /// When each of `jobs` (ids as the core names them) was submitted, if
    /// it is held as waiting.
    pub(super) fn submitted_at<'j>(
        &self,
        jobs: impl Iterator<Item = &'j str>,
    ) -> Vec<Option<DateTime<Utc>>> {
        jobs.map(|j| {
            let id = Uuid::parse_str(j).ok()?;
            let key = self.key_of.get(&id)?;
            self.jobs.get(key).map(|q| q.submitted_at)
        })
        .collect()
    }

    /// The rows of a read of the queue, each where it belongs.
    fn add(&mut self, rows: &[Row]) {
        for row in rows {
            let (id, q) = queued(row);
            if row.get("awaiting") {
                self.awaiting.insert(id);
            } else {
                let Some(head) = q.requests.first() else {
                    continue; // (every job read has a pending worker)
                };
                let key = (std::cmp::Reverse(head.priority), head.seq, id);
                self.key_of.insert(id, key);
                (self.by_tenant.entry(head.tenant.clone()).or_default()).insert(key);
                *self.units.entry(head.gpu_type.clone()).or_default() += q.requests.len() as u64;
                self.jobs.insert(key, q);
            }
        }
    }

    /// Forgets job `id`, waiting or awaiting a buddy.
    fn remove(&mut self, id: &Uuid) {
        self.awaiting.remove(id);
        let Some(key) = self.key_of.remove(id) else {
            return;
        };
        let Some(q) = self.jobs.remove(&key) else {
            return;
        };
        let Some(head) = q.requests.first() else {
            return;
        };
        if let Some(keys) = self.by_tenant.get_mut(&head.tenant) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_tenant.remove(&head.tenant);
            }
        }
        if let Some(n) = self.units.get_mut(&head.gpu_type) {
            *n = n.saturating_sub(q.requests.len() as u64);
            if *n == 0 {
                self.units.remove(&head.gpu_type);
            }
        }
    }

    /// The units of those of `jobs` held as waiting.
    pub(super) fn requests_of(&self, jobs: &[Uuid]) -> Vec<Request> {
        let mut out = Vec::new();
        for id in jobs {
            if let Some(q) = self.key_of.get(id).and_then(|k| self.jobs.get(k)) {
                out.extend(q.requests.iter().cloned());
            }
        }
        out
    }

    /// How many units are ahead of a unit at `key` of `tenant`: in the
    /// whole queue, and in its tenant's. O(queue): for explanations, not
    /// passes.
    fn ahead(&self, key: &QueueKey, tenant: &str) -> (usize, usize) {
        let units = |q: &Queued| q.requests.len();
        let all = self.jobs.range(..key).map(|(_, q)| units(q)).sum();
        let own = (self.by_tenant.get(tenant).into_iter())
            .flat_map(|keys| keys.range(..key))
            .map(|k| self.jobs.get(k).map_or(0, units))
            .sum();
        (all, own)
    }
}

/// A place in a pool's queue ([`super::Store::queue_ahead`]).
#[derive(Clone, Copy, Debug)]
pub enum QueuePlace {
    /// A waiting job's.
    Job(Uuid),
    /// A new job's at the back of this priority.
    BackOf(i32),
}

/// The held queues, by pool key (`"*"`: every shared pool at once).
#[derive(Default)]
pub(super) struct Queues {
    by_key: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<QueueState>>>>>,
    /// What of each queue a pass is shown.
    window: Mutex<QueueWindow>,
}

impl Queues {
    pub(super) fn window(&self) -> QueueWindow {
        *self.window.lock().expect("window lock")
    }

    pub(super) fn set_window(&self, window: QueueWindow) {
        *self.window.lock().expect("window lock") = window;
    }

    /// Units ahead of `at` in the queue held for `key` (the whole
    /// queue's, its tenant's); `None` when it holds no queue, or not the
    /// job named.
    pub(super) async fn ahead(
        &self,
        key: &str,
        tenant: &str,
        at: QueuePlace,
    ) -> Option<(usize, usize)> {
        let held = self.lock(key).await;
        let state = held.as_ref()?;
        let at = match at {
            QueuePlace::Job(id) => *state.key_of.get(&id)?,
            QueuePlace::BackOf(priority) => (std::cmp::Reverse(priority), u64::MAX, Uuid::max()),
        };
        Some(state.ahead(&at, tenant))
    }

    /// The queue held for `key`, locked: hold the guard from before the
    /// snapshot's transaction begins until the queue is read.
    pub(super) async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<Option<QueueState>> {
        let cell = self
            .by_key
            .lock()
            .expect("queues lock")
            .entry(key.to_string())
            .or_default()
            .clone();
        cell.lock_owned().await
    }

    /// When each of `jobs` was submitted, as the queue held for `key`
    /// knows (`None` for a job it does not hold, or when it holds none).
    pub(super) async fn submitted_at<'j>(
        &self,
        key: &str,
        jobs: impl Iterator<Item = &'j str>,
    ) -> Vec<Option<DateTime<Utc>>> {
        match self.lock(key).await.as_ref() {
            Some(state) => state.submitted_at(jobs),
            None => jobs.map(|_| None).collect(),
        }
    }

    /// Drops every held queue: each pool's next snapshot reads its whole
    /// queue (the benches compare the two reads side by side).
    pub(super) fn forget(&self) {
        self.by_key.lock().expect("queues lock").clear();
    }
}

/// How a read went, for `gangway_queue_reads_total` and the benches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueRead {
    /// Every waiting job read (no state held, or the epoch moved).
    Whole,
    /// Only the jobs that changed since the state held.
    Changes { changed: usize },
}

/// What a pass plans on from a pool's queue brought up to date: the units
/// `window` shows ([`QueueWindow`]: the first `cap` in queue order, whole
/// jobs, then each tenant's first `per_tenant`), copied in about the order
/// the planner walks them. O(window), whatever the queue's depth.
pub(super) fn requests(state: &QueueState, window: QueueWindow) -> Vec<Request> {
    let mut queue = Vec::new();
    let mut last: Option<&QueueKey> = None;
    for (key, q) in &state.jobs {
        if queue.len() >= window.cap {
            break;
        }
        queue.extend(q.requests.iter().cloned());
        last = Some(key);
    }
    if last.is_none_or(|last| state.jobs.last_key_value().is_some_and(|(k, _)| k > last)) {
        for keys in state.by_tenant.values() {
            let mut seen = 0;
            for key in keys {
                if seen >= window.per_tenant {
                    break;
                }
                let Some(q) = state.jobs.get(key) else {
                    continue;
                };
                if last.is_none_or(|last| key > last) {
                    queue.extend(q.requests.iter().cloned());
                }
                seen += q.requests.len();
            }
        }
    }
    queue
}

/// `held` brought up to date with the snapshot `tx` reads (whose xmin,
/// xmax and queue epoch are `xmin`, `xmax`, `epoch`), or read whole; on error `held` is
/// left empty (the next read is whole). `gpu_type`/`cluster` pick the pool
/// as the snapshot does.
pub(super) async fn bring_up_to_date(
    tx: &deadpool_postgres::Transaction<'_>,
    held: &mut Option<QueueState>,
    gpu_type: Option<&str>,
    cluster: Option<Uuid>,
    (xmin, xmax): (i64, i64),
    epoch: i64,
) -> Result<QueueRead> {
    let started = std::time::Instant::now();
    // Taken: a read that fails part-way leaves nothing half brought up to date.
    let (state, how) = match held.take() {
        Some(mut state) if state.epoch == epoch => {
            let mut changed: Vec<Uuid> = tx
                .query(&tx.prepare_cached(CHANGED).await?, &[&state.xmin, &xmax])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if !state.awaiting.is_empty() {
                let awaiting: Vec<Uuid> = state.awaiting.iter().copied().collect();
                let held = tx
                    .query(&tx.prepare_cached(NO_LONGER_AWAITING).await?, &[&awaiting])
                    .await?;
                changed.extend(held.iter().map(|r| r.get::<_, Uuid>(0)));
            }
            changed.sort_unstable();
            changed.dedup();
            for id in &changed {
                state.remove(id);
            }
            if !changed.is_empty() {
                let rows = tx
                    .query(
                        &tx.prepare_cached(SOME_OF_THE_QUEUE).await?,
                        &[&gpu_type, &cluster, &changed],
                    )
                    .await?;
                state.add(&rows);
            }
            state.xmin = xmin;
            (
                state,
                QueueRead::Changes {
                    changed: changed.len(),
                },
            )
        }
        _ => {
            let rows = tx
                .query(
                    &tx.prepare_cached(WHOLE_QUEUE).await?,
                    &[&gpu_type, &cluster],
                )
                .await?;
            let mut state = QueueState {
                epoch,
                xmin,
                ..QueueState::default()
            };
            state.add(&rows);
            (state, QueueRead::Whole)
        }
    };
    *held = Some(state);
    // How a pool's queue was read and what it cost (docs/operations.md,
    // metrics): a read of changes is an index lookup per changed job.
    let label = match how {
        QueueRead::Whole => "whole",
        QueueRead::Changes { changed } => {
            metrics::histogram!("gangway_queue_changed_jobs").record(changed as f64);
            "changes"
        }
    };
    metrics::histogram!("gangway_queue_read_seconds", "read" => label)
        .record(started.elapsed().as_secs_f64());
    Ok(how)
}

/// One row of the queue's read as what the core places.
fn queued(row: &Row) -> (Uuid, Queued) {
    let id: Uuid = row.get("job_id");
    let ranks: Vec<i32> = row.get("ranks");
    let mode: String = row.get("mode");
    let created_at: DateTime<Utc> = row.get("created_at");
    let base = Request {
        job: id.to_string(),
        ranks: Vec::new(),
        tenant: row.get("tenant"),
        gpu_type: row.get("gpu_type"),
        gpus_per_worker: row.get::<_, i32>("gpus_per_worker") as u32,
        required: level_from_db(row.get("required")),
        preferred: level_from_db(row.get("preferred")),
        priority: row.get::<_, i16>("priority") as i32,
        // Jobs moved off a node for its sake go first.
        seq: super::nodes::queue_seq(row.get("seq"), row.get("requeue_front")),
        estimated_duration_s: row.get::<_, i64>("estimated_duration_s").max(0) as u64,
        min_workers: 0,
        submitted: if row.get("requeue_front") {
            0 // waited "forever": first within its tenant's queue too
        } else {
            created_at.timestamp().max(0) as u64
        },
        // A reservation deleted or over is not in `reserved`: the core
        // tells its units it is unavailable.
        reservation: (row.get::<_, Option<Uuid>>("reservation_id")).map(|r| r.to_string()),
    };
    let requests = if mode == "gang" {
        // An elastic gang may start with a prefix of its ranks.
        let min_workers = row.get::<_, Option<i32>>("min_workers").unwrap_or(0);
        vec![Request {
            ranks: ranks.iter().map(|&r| r as u32).collect(),
            min_workers: min_workers.max(0) as u32,
            ..base
        }]
    } else {
        // Each worker of an array job is placed on its own.
        ranks
            .into_iter()
            .map(|r| Request {
                ranks: vec![r as u32],
                ..base.clone()
            })
            .collect()
    };
    (
        id,
        Queued {
            requests,
            submitted_at: created_at,
        },
    )
}
