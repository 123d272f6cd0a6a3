//! The scheduler's side of the store: a consistent snapshot in (the
//! generation-checked commit of what it plans is `apply.rs`), and the
//! fleet's shape and capacity.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gangway_sched::{Level, Node, Request, ReservedCapacity, Running, Share, Snapshot};
use gangway_shared::api::GpuTypeCapacity;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::IsolationLevel;
use uuid::Uuid;

use super::power::{
    gpus_fed, rack_power, rack_power_of, rack_power_rows, RackPower, RACK_POWER_SQL,
};
pub use super::queue::{QueuePlace, QueueRead};
use super::{Result, Store, StoreError};
use crate::config::HistoryOptions;

/// A snapshot plus what the applier needs that the core does not.
#[derive(Clone, Debug)]
pub struct SnapshotData {
    pub snapshot: Snapshot,
    /// The key of the pool's queue held between passes
    /// ([`Store::submitted_at`] reads it).
    pub queue_key: String,
    /// Rack (leaf) → its power budget and what its allocated GPUs draw,
    /// for every rack with a budget that the snapshot covers (a
    /// partition's: the racks holding nodes of its type). Whole-rack
    /// figures, the same whichever partition reads them.
    pub racks: BTreeMap<String, RackPower>,
    /// How the queue was read: whole, or only what changed since the
    /// previous snapshot of the same pool (`queue.rs`).
    pub queue_read: QueueRead,
    /// Units waiting per GPU type, in the window (`snapshot.queue`) and
    /// beyond it ([`Store::set_queue_window`]).
    pub queued_units: BTreeMap<String, u64>,
    /// How long the snapshot's phases took (`conn`, `head`, `reads`,
    /// `queue_copy`, `decode`, one after the other) and each of the reads
    /// sent together (`fleet`, `live`, `queue`, … timed from the batch's
    /// start, so they overlap), as `gangway_snapshot_read_seconds{read}`
    /// records them; for benches.
    pub reads: Vec<(&'static str, Duration)>,
}

type History = BTreeMap<(String, String), u64>;

/// A history read at `at` with `half_life`, reused until it is stale.
#[derive(Clone, Debug)]
pub(super) struct HistoryCache {
    at: Instant,
    half_life: Duration,
    history: History,
}

/// Each tenant's decayed average GPUs held per type, in thousandths.
///
/// Weighting the past by 2^(-age / half-life), normalised so that a GPU
/// held forever counts as 1, one GPU held from age `a2` to age `a1` (a1 <
/// a2) contributes 2^(-a1/h) − 2^(-a2/h). Intervals released more than ten
/// half-lives ago (under 0.1 % of the weight) are not read.
const HISTORY_SQL: &str = "
    SELECT tenant, gpu_type,
           round(1000 * sum(
               exp(-ln(2) * greatest(0, extract(epoch FROM now() - coalesce(released_at, now()))::float8) / $1)
             - exp(-ln(2) * least(10 * $1, greatest(0, extract(epoch FROM now() - allocated_at)::float8)) / $1)
           ))::bigint AS history
    FROM allocations a
    WHERE (released_at IS NULL OR released_at > now() - make_interval(secs => 10 * $1))
      -- A dedicated cluster's use is not the tenant's share of the pool.
      AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = a.job_id AND j.cluster_id IS NOT NULL)
    GROUP BY tenant, gpu_type";

/// Every node's GPUs at one `sched_state.fleet_version`
/// ([`Store::fleet_gpus`]).
#[derive(Debug)]
pub(super) struct FleetGpus {
    version: i64,
    nodes: HashMap<String, NodeGpus>,
}

#[derive(Debug)]
struct NodeGpus {
    gpu_type: String,
    /// The dedicated cluster it is bound to.
    cluster: Option<Uuid>,
    /// A spare: it takes no work until it replaces a node.
    spare: bool,
    /// Its GPUs' indices, in order.
    gpus: Vec<i32>,
}

/// One non-spare node as the validator sees it.
#[derive(Clone, Debug)]
pub struct FleetShape {
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
    pub gpus: u32,
    /// The most GPUs of the node's type its rack's power budget could ever
    /// feed at once (the type's share of the budget over its draw, as the
    /// snapshot splits it: `rack_power`); `None`: no budget.
    pub rack_power_gpus: Option<u64>,
}

/// The snapshot's first read: the scheduling generation, the database's
/// clock, the fleet's version and the transaction's snapshot bounds (for
/// the queue's changes, `queue.rs`).
const HEAD_SQL: &str = "
    SELECT generation, extract(epoch FROM now())::bigint, fleet_version,
           pg_snapshot_xmin(pg_current_snapshot())::text::bigint, queue_epoch,
           pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    FROM sched_state WHERE id = 1";

/// The pool's nodes and whether each takes new work. A rack reporting
/// thermal throttling: none of its nodes takes new work (running work
/// stays).
const NODES_SQL: &str = "
    SELECT n.node_id, n.spine, n.leaf, n.nvlink_domain, n.gpu_type,
           (NOT n.spare
            AND a.last_sync_at > now() - make_interval(secs => $1)
            AND NOT EXISTS (SELECT 1 FROM nodes r
                            WHERE r.leaf = n.leaf AND r.rack_throttled)
            -- A cluster's node being given back, or of a
            -- cluster being deleted, takes no new work.
            AND NOT n.cluster_release
            AND (n.cluster_id IS NULL OR c.state = 'active'))
               AS schedulable,
           n.operator_state, n.admin_reason, n.drain_wait,
           extract(epoch FROM n.drain_deadline)::bigint AS drain_deadline_s,
           n.health
    FROM nodes n
    JOIN agents a ON a.agent_id = n.agent_id
    LEFT JOIN clusters c ON c.cluster_id = n.cluster_id
    WHERE ($2::text IS NULL OR n.gpu_type = $2)
      AND n.cluster_id IS NOT DISTINCT FROM $3
    ORDER BY n.node_id";

/// GPUs held for a gang moving onto a spare (`spares.rs`) while it is
/// being preempted: taken, like allocated ones (a GPU both allocated and
/// held is taken either way).
const HOLDS_SQL: &str = "
    SELECT h.node_id, h.gpu_index FROM gpu_holds h
    JOIN jobs j ON j.job_id = h.job_id AND j.state = 'preempting'";

/// Quotas: the cap is the core's hard limit; guarantee and weight feed
/// fair sharing together with the decayed history.
const TERMS_SQL: &str = "SELECT tenant, gpu_type, guaranteed_gpus, max_gpus, weight FROM quotas";

/// Every live allocation of the region, grouped by job, with what the
/// pass needs of the job: one read for three things ([`LiveJobs`]). What
/// holds GPUs now, and when each is expected to let go (start plus
/// estimate), for reservations; when it started and last checkpointed, how
/// often it was preempted and whether a preemption is in flight, for
/// preemption; which GPUs of each node are taken, whatever job or pool
/// holds them; and what each tenant holds of each type, for fair sharing
/// (across types: dominant shares). Three reads of the live allocations
/// before (per job of the pool, per node of the type, per tenant of the
/// pool): under a burst on a 10,240-GPU region, 42, 23 and 9 ms a pass.
///
/// The allocations grouped by job first, each job then looked up once:
/// joined row by row, at 10,240 allocated GPUs the read looked up and
/// sorted every GPU's job row (40 ms a pass; `queue_depth` bench). Each
/// job is looked up by key (`OFFSET 0` keeps it a lookup): as a join, with
/// a filter on the pool's cluster estimated at one row, the planner
/// scanned every job for each allocated one (seconds at 50,000 queued).
/// A job's nodes and GPUs come in the same (any) order; they are sorted
/// here, not by a sort per job in the database.
const LIVE_JOBS_SQL: &str = "
    WITH a AS (
        SELECT job_id, min(allocated_at) AS started, min(gpu_type) AS held_type,
               count(*) AS held, array_agg(node_id) AS nodes, array_agg(gpu_index) AS gpus
        FROM allocations
        WHERE released_at IS NULL
        GROUP BY job_id)
    SELECT a.job_id, a.held_type, a.held, j.cluster_id, j.tenant, j.gpu_type, j.priority,
           (extract(epoch FROM a.started)::bigint
            + j.estimated_duration_s) AS expected_end,
           extract(epoch FROM a.started)::bigint AS started,
           extract(epoch FROM j.checkpointed_at)::bigint AS checkpointed,
           j.preemptions,
           CASE WHEN j.state = 'preempting' THEN coalesce(j.preempted_for, '')
           END AS preempted_for,
           CASE WHEN j.state = 'preempting' THEN
               (SELECT extract(epoch FROM max(e.at))::bigint FROM job_events e
                WHERE e.job_id = j.job_id AND e.kind = 'preempted')
           END AS preempted_at,
           a.nodes, a.gpus,
           j.preemptions - j.grows - j.node_moves AS capped_preemptions,
           CASE WHEN j.mode = 'gang' AND j.min_workers < j.workers
                THEN j.run_workers END AS elastic_workers,
           j.workers, j.gpus_per_worker, j.required_level::text AS required,
           j.reservation_id
    FROM a
    CROSS JOIN LATERAL (SELECT * FROM jobs j
                        WHERE j.job_id = a.job_id OFFSET 0) j
    ORDER BY a.job_id";

/// A running job's GPUs: each node's, in node and GPU order.
type HeldGpus = Vec<(String, Vec<u32>)>;

/// [`LIVE_JOBS_SQL`]'s rows, as one pool sees them.
struct LiveJobs<'r> {
    /// The pool's running jobs (of its GPU type, or any without one; of
    /// its cluster, or of none for the shared pools), each with its GPUs
    /// per node, in node and GPU order.
    running: Vec<(&'r tokio_postgres::Row, HeldGpus)>,
    /// The GPUs taken on each node of the pool's type, whatever job holds
    /// them (a node moved out of a cluster still runs that cluster's work).
    taken: BTreeMap<String, Vec<i32>>,
    /// What each tenant holds of each type in the pool's cluster (or
    /// outside every cluster), whatever the pool's type.
    usage: BTreeMap<(String, String), u32>,
}

impl<'r> LiveJobs<'r> {
    fn of(rows: &'r [tokio_postgres::Row], only: Option<&str>, cluster: Option<Uuid>) -> Self {
        let mut out = LiveJobs {
            running: Vec::new(),
            taken: BTreeMap::new(),
            usage: BTreeMap::new(),
        };
        for row in rows {
            let in_pool = row.get::<_, Option<Uuid>>("cluster_id") == cluster;
            if in_pool {
                let key = (row.get("tenant"), row.get("gpu_type"));
                let held = u32::try_from(row.get::<_, i64>("held")).unwrap_or(u32::MAX);
                *out.usage.entry(key).or_default() += held;
            }
            if only.is_some_and(|t| t != row.get::<_, &str>("held_type")) {
                continue;
            }
            let nodes: Vec<String> = row.get("nodes");
            let gpus: Vec<i32> = row.get("gpus");
            let mut pairs: Vec<(String, i32)> = nodes.into_iter().zip(gpus).collect();
            pairs.sort_unstable();
            for (n, g) in &pairs {
                out.taken.entry(n.clone()).or_default().push(*g);
            }
            if !in_pool {
                continue;
            }
            let mut held = HeldGpus::new();
            for (n, g) in pairs {
                match held.last_mut() {
                    Some((last, list)) if *last == n => list.push(g as u32),
                    _ => held.push((n, vec![g as u32])),
                }
            }
            out.running.push((row, held));
        }
        out
    }
}

/// Capacity reservations not deleted nor over, the earliest first.
const RESERVED_SQL: &str = "
    SELECT reservation_id, tenant, gpu_type, gpus, level::text AS level, path,
           extract(epoch FROM start_at)::bigint AS start_s,
           extract(epoch FROM end_at)::bigint AS end_s
    FROM capacity_reservations
    WHERE state = 'active' AND (end_at IS NULL OR end_at > now())
      AND ($1::text IS NULL OR gpu_type = $1) AND $2::uuid IS NULL
    ORDER BY start_at, reservation_id";

/// Jobs with the first claim on what their victims free (V32).
const CLAIMS_SQL: &str = "
    SELECT job_id, extract(epoch FROM claim_until)::bigint AS until FROM jobs
    WHERE claim_until > now() AND ($1::text IS NULL OR gpu_type = $1)
      AND cluster_id IS NOT DISTINCT FROM $2";

/// Every covered pool's partition version.
const PARTITIONS_SQL: &str = "
    SELECT pool, version FROM sched_partitions
    WHERE ($1::text IS NULL AND pool NOT LIKE 'cluster:%') OR pool = $1";

/// `fut`'s result, and how long after `start` it came (a read of a batch
/// sent together, timed from the batch's start).
async fn timed<T>(
    start: Instant,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, Duration)> {
    let out = fut.await?;
    Ok((out, start.elapsed()))
}

/// Times a snapshot's phases one after the other, and the reads sent
/// together ([`Laps::record`]) (`gangway_snapshot_read_seconds`, by read),
/// and keeps the times for [`SnapshotData::reads`].
struct Laps(Instant, Vec<(&'static str, Duration)>);

impl Laps {
    /// The phase `read` ended now.
    fn lap(&mut self, read: &'static str) {
        let now = Instant::now();
        self.record(read, now.duration_since(self.0));
        self.0 = now;
    }

    /// `read` took `took` (of a phase already lapped).
    fn record(&mut self, read: &'static str, took: Duration) {
        metrics::histogram!("gangway_snapshot_read_seconds", "read" => read)
            .record(took.as_secs_f64());
        self.1.push((read, took));
    }
}

pub(super) fn level_from_db(s: &str) -> Level {
    match s {
        "nvlink" => Level::Nvlink,
        "leaf" => Level::Leaf,
        "spine" => Level::Spine,
        _ => Level::Region,
    }
}

impl Store {
    /// [`Store::snapshot_with`] with the default fair-share history (a 24 h
    /// half-life, reused for 10 s).
    pub async fn snapshot(&self, agent_timeout: Duration) -> Result<SnapshotData> {
        let history = crate::config::Planning::with_agent_timeout(agent_timeout).history;
        self.snapshot_with(agent_timeout, history).await
    }

    /// Reads everything the scheduler core needs, in one repeatable-read
    /// transaction so the parts agree. Nodes whose agent has not synced for
    /// `agent_timeout` are not schedulable.
    pub async fn snapshot_with(
        &self,
        agent_timeout: Duration,
        history_options: HistoryOptions,
    ) -> Result<SnapshotData> {
        self.snapshot_of(None, agent_timeout, history_options).await
    }

    /// [`Store::snapshot_with`] for one scheduling partition: a GPU type's
    /// shared pool — the nodes, queued and running jobs of that type only,
    /// with every tenant's terms, usage and the region's capacity of every
    /// type (fair sharing's dominant shares span types; see
    /// `gangway_sched::plan_partitioned`) — or a dedicated cluster
    /// (`clusters::pool_key`): its nodes and jobs only, with no quotas,
    /// shares or reservations (the nodes are its tenant's alone).
    pub async fn snapshot_partition(
        &self,
        gpu_type: &str,
        agent_timeout: Duration,
        history_options: HistoryOptions,
    ) -> Result<SnapshotData> {
        (self.snapshot_of(Some(gpu_type), agent_timeout, history_options)).await
    }

    async fn snapshot_of(
        &self,
        only: Option<&str>,
        agent_timeout: Duration,
        history_options: HistoryOptions,
    ) -> Result<SnapshotData> {
        let mut laps = Laps(Instant::now(), Vec::new());
        // The pool's queue, held between passes (`queue.rs`): locked before
        // the snapshot is taken, until the jobs it must show are known.
        let only_key = only.unwrap_or("*");
        let mut held_queue = self.queues.lock(only_key).await;
        let mut conn = self.conn().await?;
        let tx = read_only_snapshot(&mut conn).await?;
        laps.lap("conn");
        let head = tx
            .query_one(&super::cached(&tx, HEAD_SQL).await?, &[])
            .await?;
        let generation: i64 = head.get(0);
        // The database's clock, so every replica plans on the same time.
        let now = head.get::<_, i64>(1).max(0) as u64;
        // Which GPUs each node has: read again only when the fleet changed.
        let fleet = self.fleet_gpus(&tx, head.get(2)).await?;
        let timeout_s = agent_timeout.as_secs_f64();
        // The partition's key (`only`), the cluster it names if it names
        // one, and the GPU type it covers (a cluster's: its nodes').
        // Without a cluster, only the shared pools: no cluster's nodes,
        // jobs or use.
        let key = only;
        let cluster = only.and_then(super::clusters::cluster_of_key);
        let cluster_type: Option<String> = match cluster {
            Some(c) => Some(
                tx.query_opt("SELECT gpu_type FROM clusters WHERE cluster_id = $1", &[&c])
                    .await?
                    .ok_or(StoreError::NotFound)?
                    .get(0),
            ),
            None => None,
        };
        let only: Option<&str> = cluster_type.as_deref().or(only);
        laps.lap("head");

        // The rest is sent at once and answered in order on the one
        // connection (tokio-postgres pipelines concurrent calls): under
        // load each round trip waited for both processes to be scheduled
        // again, and a snapshot of a dozen reads one after the other took
        // 0.5 s a pass on a busy 10,240-GPU region where its reads' own
        // work is tens of milliseconds (docs/benchmarks-history.md,
        // "Session 31"). Each is sent with its parameters' types
        // (`query_typed`): parsed, bound and run in one round trip, and
        // planned for the values at hand at every pass, as when each was
        // sent as text. (Prepared per table scale, they were no faster in
        // the `queue_depth` bench — slower at its first depth — and would
        // run on PostgreSQL's generic plans for an optional pool and
        // cluster, the kind of estimate that once made a read take 60 s.)
        // The reads' times below are each from the start of the batch.
        let sent = Instant::now();
        let (
            (node_rows, fleet_t),
            (hold_rows, holds_t),
            (how, queue_t),
            (terms, terms_t),
            (history, history_t),
            (live_rows, live_t),
            (reserved_rows, reserved_t),
            (power_rows, power_t),
            (claim_rows, claims_t),
            (partition_rows, partitions_t),
        ) = tokio::try_join!(
            timed(sent, async {
                let params: [(&(dyn ToSql + Sync), Type); 3] = [
                    (&timeout_s, Type::FLOAT8),
                    (&only, Type::TEXT),
                    (&cluster, Type::UUID),
                ];
                Ok(tx.query_typed(NODES_SQL, &params).await?)
            }),
            timed(sent, async { Ok(tx.query_typed(HOLDS_SQL, &[]).await?) }),
            timed(sent, async {
                super::queue::bring_up_to_date(
                    &tx,
                    &mut held_queue,
                    only,
                    cluster,
                    (head.get(3), head.get(5)),
                    head.get(4),
                )
                .await
            }),
            timed(sent, async {
                // A cluster's nodes are its tenant's: no terms, no history.
                if cluster.is_some() {
                    return Ok(Vec::new());
                }
                Ok(tx.query_typed(TERMS_SQL, &[]).await?)
            }),
            timed(sent, async {
                if cluster.is_some() {
                    return Ok(History::new());
                }
                self.history(&tx, history_options).await
            }),
            timed(sent, async {
                Ok(tx.query_typed(LIVE_JOBS_SQL, &[]).await?)
            }),
            timed(sent, async {
                let params: [(&(dyn ToSql + Sync), Type); 2] =
                    [(&only, Type::TEXT), (&cluster, Type::UUID)];
                Ok(tx.query_typed(RESERVED_SQL, &params).await?)
            }),
            timed(sent, async {
                Ok(tx.query_typed(RACK_POWER_SQL, &[]).await?)
            }),
            timed(sent, async {
                let params: [(&(dyn ToSql + Sync), Type); 2] =
                    [(&only, Type::TEXT), (&cluster, Type::UUID)];
                Ok(tx.query_typed(CLAIMS_SQL, &params).await?)
            }),
            timed(sent, async {
                Ok(tx
                    .query_typed(PARTITIONS_SQL, &[(&key, Type::TEXT)])
                    .await?)
            }),
        )?;
        tx.commit().await?;
        laps.lap("reads");
        for (read, took) in [
            ("fleet", fleet_t),
            ("holds", holds_t),
            ("queue", queue_t),
            ("terms", terms_t),
            ("history", history_t),
            ("live", live_t),
            ("reserved", reserved_t),
            ("power", power_t),
            ("claims", claims_t),
            ("partitions", partitions_t),
        ] {
            laps.record(read, took);
        }

        let live_jobs = LiveJobs::of(&live_rows, only, cluster);
        let mut used: BTreeMap<String, Vec<i32>> = live_jobs.taken;
        for row in &hold_rows {
            used.entry(row.get(0)).or_default().push(row.get(1));
        }
        let nodes: Vec<Node> = node_rows
            .iter()
            .filter_map(|row| {
                let id: String = row.get("node_id");
                // A node without GPUs has nothing to schedule.
                let all = &fleet.nodes.get(&id)?.gpus;
                let taken = used.get(&id);
                // What operators asked and what the node's signals say,
                // decided in one place: only usable GPUs count as free.
                let decision = super::nodes::decision_of(row, all.len() as u32, &self.health, now);
                let free = all
                    .iter()
                    .filter(|g| !taken.is_some_and(|t| t.contains(g)))
                    .map(|&g| g as u32)
                    .filter(|g| decision.usable.contains(g))
                    .collect();
                Some(Node {
                    id,
                    spine: row.get("spine"),
                    leaf: row.get("leaf"),
                    nvlink_domain: row.get("nvlink_domain"),
                    gpu_type: row.get("gpu_type"),
                    gpus: all.len() as u32,
                    free,
                    schedulable: row.get::<_, bool>("schedulable") && decision.schedulable,
                })
            })
            .collect();

        let held = held_queue.as_ref().expect("brought up to date");
        let mut queue = super::queue::requests(held, self.queues.window());
        let queued_units = held.units.clone();
        laps.lap("queue_copy");
        let read = match how {
            QueueRead::Whole => "whole",
            QueueRead::Changes { .. } => "changes",
        };
        metrics::counter!("gangway_queue_reads_total", "read" => read).increment(1);

        // Quotas: the cap is the core's hard limit; guarantee and weight
        // feed fair sharing together with the decayed history.
        let mut quotas = BTreeMap::new();
        let mut shares: BTreeMap<(String, String), Share> = BTreeMap::new();
        for row in terms {
            let key: (String, String) = (row.get(0), row.get(1));
            if let Some(max) = row.get::<_, Option<i32>>(3) {
                quotas.insert(key.clone(), max.max(0) as u32);
            }
            shares.insert(
                key,
                Share {
                    guaranteed: row.get::<_, i32>(2).max(0) as u32,
                    weight: row.get::<_, i32>(4).max(1) as u32,
                    history: 0,
                },
            );
        }
        for (key, history) in history {
            shares.entry(key).or_default().history = history;
        }
        // Capacity reservations not deleted nor over, the earliest first.
        let reserved: Vec<ReservedCapacity> = reserved_rows
            .iter()
            .map(|r| ReservedCapacity {
                id: r.get::<_, Uuid>("reservation_id").to_string(),
                tenant: r.get("tenant"),
                gpu_type: r.get("gpu_type"),
                gpus: r.get::<_, i32>("gpus").max(0) as u32,
                level: level_from_db(r.get("level")),
                path: r.get("path"),
                start: r.get::<_, i64>("start_s").max(0) as u64,
                end: r.get::<_, Option<i64>>("end_s").map(|e| e.max(0) as u64),
            })
            .collect();
        let live: BTreeSet<&str> = reserved.iter().map(|r| r.id.as_str()).collect();
        let running: Vec<Running> = (live_jobs.running.into_iter())
            .map(|(row, held)| {
                let job: Uuid = row.get("job_id");
                Running {
                    job: job.to_string(),
                    tenant: row.get("tenant"),
                    gpu_type: row.get("gpu_type"),
                    priority: row.get::<_, i16>("priority") as i32,
                    gpus: held,
                    expected_end: row.get::<_, i64>("expected_end").max(0) as u64,
                    started: row.get::<_, i64>("started").max(0) as u64,
                    checkpointed: row
                        .get::<_, Option<i64>>("checkpointed")
                        .map(|t| t.max(0) as u64),
                    // Restarts to grow do not count against the cap.
                    preemptions: row.get::<_, i32>("capped_preemptions").max(0) as u32,
                    preempted_for: row.get("preempted_for"),
                    preempted_at: row
                        .get::<_, Option<i64>>("preempted_at")
                        .map(|t| t.max(0) as u64),
                    // An elastic gang's shape, so the core may restart it
                    // larger.
                    elastic: row.get::<_, Option<i32>>("elastic_workers").map(|workers| {
                        gangway_sched::Elastic {
                            workers: workers.max(0) as u32,
                            max_workers: row.get::<_, i32>("workers").max(0) as u32,
                            gpus_per_worker: row.get::<_, i32>("gpus_per_worker").max(0) as u32,
                            required: level_from_db(row.get("required")),
                        }
                    }),
                    // Only a live reservation's: once it is deleted or over,
                    // what runs in it is ordinary work (a victim like any).
                    reservation: (row.get::<_, Option<Uuid>>("reservation_id"))
                        .map(|r| r.to_string())
                        .filter(|r| live.contains(r.as_str())),
                }
            })
            .collect();
        let usage = live_jobs.usage;
        // A partition sees the region's capacity of every type (dominant
        // shares); a whole snapshot counts it from its nodes.
        let mut capacity: BTreeMap<String, u64> = BTreeMap::new();
        if only.is_some() {
            for n in fleet.nodes.values().filter(|n| n.cluster == cluster) {
                *capacity.entry(n.gpu_type.clone()).or_default() += n.gpus.len() as u64;
            }
        }
        // Rack power: computed over every partition of every budgeted
        // rack, then narrowed to this one's (the shared pools', without a
        // key), so a rack's figures are the same whichever partition reads
        // them.
        let power_rows = rack_power_of(&power_rows);
        let (mut racks, headroom) = rack_power(&power_rows);
        let pool_type: BTreeMap<&str, &str> = (power_rows.iter())
            .map(|r| (r.pool.as_str(), r.gpu_type.as_str()))
            .collect();
        let mut power_headroom_w: BTreeMap<(String, String), u64> = (headroom.into_iter())
            .filter(|((_, pool), _)| match key {
                Some(k) => pool == k,
                None => super::clusters::cluster_of_key(pool).is_none(),
            })
            .map(|((leaf, pool), w)| ((leaf, pool_type[pool.as_str()].to_string()), w))
            .collect();
        // The draws that matter: those of types in budgeted racks (the
        // rows' draw is the type's, the most any of its nodes reports).
        let gpu_power_w: BTreeMap<String, u32> = (power_rows.iter())
            .map(|r| {
                (
                    r.gpu_type.clone(),
                    u32::try_from(r.draw_w).unwrap_or(u32::MAX),
                )
            })
            .collect();
        if let Some(k) = key {
            power_headroom_w.retain(|(_, ty), _| Some(ty.as_str()) == only);
            let covered: BTreeSet<&str> = (power_rows.iter())
                .filter(|r| r.pool == k)
                .map(|r| r.leaf.as_str())
                .collect();
            racks.retain(|leaf, _| covered.contains(leaf.as_str()));
        }

        // Jobs with the first claim on what their victims free (V32).
        let claims: BTreeMap<String, u64> = claim_rows
            .iter()
            .map(|r| {
                let job: Uuid = r.get("job_id");
                (job.to_string(), r.get::<_, i64>("until").max(0) as u64)
            })
            .collect();
        // Jobs owed what their victims free come first in the core's
        // order: shown whatever the window, so that no claim goes to
        // another for want of its owner.
        if (queue.len() as u64) < queued_units.values().sum::<u64>() {
            let listed: BTreeSet<&str> = queue.iter().map(|r| r.job.as_str()).collect();
            let owed: Vec<Uuid> = (gangway_sched::types::owed(&claims, &running, now).into_iter())
                .filter(|j| !listed.contains(j))
                .filter_map(|j| Uuid::parse_str(j).ok())
                .collect();
            queue.extend(held.requests_of(&owed));
        }
        drop(held_queue);

        // Every covered type's partition version (no row yet: 0).
        let mut partitions: BTreeMap<String, i64> = match key {
            Some(k) => [(k.to_string(), 0)].into(),
            None => (nodes.iter().map(|n: &Node| n.gpu_type.clone()))
                .chain(queue.iter().map(|r: &Request| r.gpu_type.clone()))
                .map(|t| (t, 0))
                .collect(),
        };
        for row in partition_rows {
            partitions.insert(row.get(0), row.get(1));
        }
        laps.lap("decode");
        Ok(SnapshotData {
            snapshot: Snapshot {
                generation,
                partitions,
                capacity,
                nodes,
                queue,
                quotas,
                shares,
                usage,
                now,
                running,
                gpu_power_w,
                power_headroom_w,
                reserved,
                claims,
            },
            queue_key: only_key.to_string(),
            racks,
            queue_read: how,
            queued_units,
            reads: laps.1,
        })
    }

    /// Forgets the queues held between passes: the next snapshot of each
    /// pool reads its whole queue (`queue.rs`; for benches that compare
    /// the two reads).
    pub fn forget_queues(&self) {
        self.queues.forget();
    }

    /// When each of `jobs` (as a plan names them) was submitted, for those
    /// the pool's held queue (`SnapshotData::queue_key`) still holds: a
    /// pass's placements, for the queue-wait metric, without copying every
    /// queued job's time into each snapshot.
    /// What of a pool's queue each pass is shown
    /// ([`gangway_sched::QueueWindow`]; its default unless set).
    pub fn set_queue_window(&self, window: gangway_sched::QueueWindow) {
        self.queues.set_window(window);
    }

    pub fn queue_window(&self) -> gangway_sched::QueueWindow {
        self.queues.window()
    }

    /// Units ahead of `at` (a waiting job of `tenant`, or a new one's
    /// place) in its pool's held queue (`queue_key`, as the last snapshot
    /// of that pool brought it up to date): in the whole queue and in its
    /// tenant's. `None` when the queue held does not hold the job as
    /// waiting. O(queue).
    pub async fn queue_ahead(
        &self,
        queue_key: &str,
        tenant: &str,
        at: QueuePlace,
    ) -> Option<(usize, usize)> {
        self.queues.ahead(queue_key, tenant, at).await
    }

    pub async fn submitted_at<'j>(
        &self,
        queue_key: &str,
        jobs: impl Iterator<Item = &'j str>,
    ) -> Vec<Option<DateTime<Utc>>> {
        self.queues.submitted_at(queue_key, jobs).await
    }

    /// Every node's GPUs as of fleet version `version` (read in `tx`), from
    /// the cache unless the fleet changed since it was read: only a
    /// registration, a spare swap or a cluster's change of nodes alters
    /// them, and each moves the version (a read over every GPU, seconds on
    /// 40,000 GPUs under load, saved on every pass).
    async fn fleet_gpus(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        version: i64,
    ) -> Result<Arc<FleetGpus>> {
        if let Some(f) = self.fleet_gpus.lock().expect("fleet cache lock").as_ref() {
            if f.version == version {
                return Ok(f.clone());
            }
        }
        let rows = tx
            .query(
                "SELECT n.node_id, n.gpu_type, n.cluster_id, n.spare,
                        array_agg(g.gpu_index ORDER BY g.gpu_index) AS gpus
                 FROM nodes n JOIN gpus g ON g.node_id = n.node_id
                 GROUP BY n.node_id",
                &[],
            )
            .await?;
        let fleet = Arc::new(FleetGpus {
            version,
            nodes: rows
                .iter()
                .map(|r| {
                    let gpus = NodeGpus {
                        gpu_type: r.get("gpu_type"),
                        cluster: r.get("cluster_id"),
                        spare: r.get("spare"),
                        gpus: r.get("gpus"),
                    };
                    (r.get("node_id"), gpus)
                })
                .collect(),
        });
        *self.fleet_gpus.lock().expect("fleet cache lock") = Some(fleet.clone());
        Ok(fleet)
    }

    /// The decayed past usage, read in `tx` unless a recent enough reading
    /// with the same half-life can be reused.
    async fn history(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        options: HistoryOptions,
    ) -> Result<History> {
        if let Some(c) = self.history.lock().expect("history cache lock").as_ref() {
            if c.half_life == options.half_life && c.at.elapsed() < options.refresh {
                return Ok(c.history.clone());
            }
        }
        let half_life_s = options.half_life.as_secs_f64().max(1.0);
        let mut history = History::new();
        for row in tx.query(HISTORY_SQL, &[&half_life_s]).await? {
            let h = row.get::<_, Option<i64>>("history").unwrap_or(0).max(0) as u64;
            if h > 0 {
                history.insert((row.get("tenant"), row.get("gpu_type")), h);
            }
        }
        *self.history.lock().expect("history cache lock") = Some(HistoryCache {
            at: Instant::now(),
            half_life: options.half_life,
            history: history.clone(),
        });
        Ok(history)
    }
}

/// What a pass over a partition could place ([`Store::partition_outlook`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outlook {
    /// The fewest GPUs any of its waiting work needs to start; `None`:
    /// nothing waits and nothing may grow.
    pub least_needed: Option<u64>,
    /// At most how many of its GPUs are free.
    pub free_at_most: u64,
}

impl Outlook {
    /// Work waits (or may grow).
    pub fn has_work(&self) -> bool {
        self.least_needed.is_some()
    }

    /// Some of the work that waits could fit in the free GPUs.
    pub fn could_place(&self) -> bool {
        self.least_needed.is_some_and(|n| n <= self.free_at_most)
    }
}

impl Store {
    /// The fleet's version: it moves whenever nodes or GPUs change.
    pub async fn fleet_version(&self) -> Result<i64> {
        let conn = self.conn().await?;
        let version = conn
            .prepare_cached("SELECT fleet_version FROM sched_state WHERE id = 1")
            .await?;
        Ok(conn.query_one(&version, &[]).await?.get(0))
    }

    /// What a pass over the partition (`key`: a GPU type's shared pool or
    /// a cluster's) could place: the fewest GPUs any of its waiting work
    /// needs to start — a waiting unit's smallest start (the queue a
    /// snapshot reads), or a worker of an elastic gang running below its
    /// maximum (it may grow) — and at most how many of its GPUs are free.
    /// The planner places nothing else: with no work its plan is empty
    /// whatever the fleet, and with fewer GPUs free than the least work
    /// needs it can place nothing, so the pass loop need not read the
    /// fleet (`scheduler::partition_loop`). The waiting jobs are the
    /// pool's held queue brought up to date (`queue.rs`: what changed
    /// since, an index lookup), the growing gangs an indexed lookup of the
    /// running ones. The free GPUs are an upper bound: the pool's GPUs
    /// (the cached fleet, [`Store::fleet_gpus`]; spares take no work) less
    /// the live allocations of its GPU type (a count over the live ones'
    /// index) that no other pool of the type could hold — a silent or
    /// cordoned node's free GPUs count too. (Counted by joining the pool's nodes, 32 ms a call on a
    /// 10,240-GPU region under a burst: a tenth of the pass it saves.)
    pub async fn partition_outlook(&self, key: &str) -> Result<Outlook> {
        let cluster = super::clusters::cluster_of_key(key);
        let mut held = self.queues.lock(key).await;
        let mut conn = self.conn().await?;
        let tx = read_only_snapshot(&mut conn).await?;
        let head = tx
            .query_one(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, queue_epoch,
                        (SELECT gpu_type FROM clusters WHERE cluster_id = $1),
                        pg_snapshot_xmax(pg_current_snapshot())::text::bigint, fleet_version
                 FROM sched_state WHERE id = 1",
                &[&cluster],
            )
            .await?;
        // The pool as the snapshot picks it (`snapshot_of`): a cluster's
        // jobs of its GPU type, or the type's shared pool.
        let cluster_type: Option<String> = head.get(2);
        if cluster.is_some() && cluster_type.is_none() {
            // The cluster is gone: nothing of it is placed.
            return Ok(Outlook::default());
        }
        let fleet = self.fleet_gpus(&tx, head.get(4)).await?;
        let gpu_type = cluster_type.as_deref().or(Some(key));
        // What changed since, an index lookup: where an `EXISTS` over the
        // pending workers visited every waiting job of every pool to find
        // none of this one's. The two reads of the running gangs and the
        // free GPUs go with it (answered in order on the one connection).
        let queue = super::queue::bring_up_to_date(
            &tx,
            &mut held,
            gpu_type,
            cluster,
            (head.get(0), head.get(3)),
            head.get(1),
        );
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&gpu_type, Type::TEXT), (&cluster, Type::UUID)];
        let growing = tx.query_typed(
            "SELECT min(j.gpus_per_worker)::bigint FROM jobs j
             WHERE j.state IN ('starting', 'running') AND j.mode = 'gang'
               AND j.min_workers < j.workers AND j.run_workers < j.workers
               AND ($1::text IS NULL OR j.gpu_type = $1)
               AND j.cluster_id IS NOT DISTINCT FROM $2",
            &params,
        );
        let live = tx.query_typed(
            "SELECT count(*) FROM allocations WHERE released_at IS NULL AND gpu_type = $1",
            &params[..1],
        );
        let (_, growing, live) = tokio::try_join!(
            queue,
            async { Ok::<_, StoreError>(growing.await?) },
            async { Ok::<_, StoreError>(live.await?) },
        )?;
        let waiting = held.as_ref().and_then(|q| q.smallest_start());
        drop(held);
        tx.commit().await?;
        let grow: Option<i64> = growing.first().and_then(|r| r.get(0));
        let live = live.first().map_or(0, |r| r.get::<_, i64>(0)).max(0) as u64;
        // The type's GPUs in this pool, and in the type's other pools: at
        // most that many of its live allocations are not this pool's (a
        // spare holds none: nothing is placed on one).
        let (mut ours, mut elsewhere) = (0u64, 0u64);
        for n in
            (fleet.nodes.values()).filter(|n| !n.spare && Some(n.gpu_type.as_str()) == gpu_type)
        {
            let count = if n.cluster == cluster {
                &mut ours
            } else {
                &mut elsewhere
            };
            *count += n.gpus.len() as u64;
        }
        Ok(Outlook {
            least_needed: waiting
                .into_iter()
                .chain(grow.map(|g| g.max(0) as u64))
                .min(),
            free_at_most: ours.saturating_sub(live.saturating_sub(elsewhere)),
        })
    }

    /// The region's non-spare nodes by scheduling partition (a GPU type's
    /// shared pool, or a dedicated cluster's `clusters::pool_key`), for
    /// validating that a job could ever fit and for the scheduler's pass
    /// loops, with the fleet version they were read at.
    pub async fn fleet_shape(&self) -> Result<(i64, BTreeMap<String, Vec<FleetShape>>)> {
        let mut conn = self.conn().await?;
        let tx = read_only_snapshot(&mut conn).await?;
        let version: i64 = tx
            .query_one("SELECT fleet_version FROM sched_state WHERE id = 1", &[])
            .await?
            .get(0);
        let rows = tx
            .query(
                "SELECT pool_of(n.gpu_type, n.cluster_id) AS pool,
                        n.spine, n.leaf, n.nvlink_domain, count(*) AS gpus
                 FROM nodes n JOIN gpus g ON g.node_id = n.node_id
                 WHERE NOT n.spare
                 GROUP BY n.node_id",
                &[],
            )
            .await?;
        // What each budgeted rack's share could feed of each type with
        // nothing else running there.
        let mut power_rows = rack_power_rows(&*tx).await?;
        // With nothing running there.
        power_rows.iter_mut().for_each(|r| r.taken = 0);
        tx.commit().await?;
        let feeds = gpus_fed(&power_rows);
        let mut by_type: BTreeMap<String, Vec<FleetShape>> = BTreeMap::new();
        for r in &rows {
            let (ty, leaf): (String, String) = (r.get(0), r.get(2));
            let rack_power_gpus = feeds.get(&(leaf.clone(), ty.clone())).copied();
            by_type.entry(ty).or_default().push(FleetShape {
                spine: r.get(1),
                leaf,
                nvlink_domain: r.get(3),
                gpus: r.get::<_, i64>(4) as u32,
                rack_power_gpus,
            });
        }
        Ok((version, by_type))
    }
}

impl Store {
    /// Capacity per GPU type and job counts, for `GET /v1/region` and metrics
    /// (the global tier routes by `free`): schedulable and free GPUs leave
    /// out racks reporting thermal throttling and dedicated clusters' nodes
    /// (the shared pool's capacity), and a budgeted rack counts no more
    /// free GPUs than its power headroom can feed.
    pub async fn capacity(
        &self,
        agent_timeout: Duration,
    ) -> Result<(Vec<GpuTypeCapacity>, u64, u64)> {
        let conn = self.conn().await?;
        let timeout_s = agent_timeout.as_secs_f64();
        // Per type and rack, so that a rack's power budget can cap what is
        // free there. A rack reporting thermal throttling takes no new
        // work: its GPUs are neither schedulable nor free.
        // Node by node, not GPU by GPU (a node's usable GPUs are an array):
        // `open` is a node that may take new work at all; its free GPUs are
        // the usable ones no live allocation holds.
        let rows = conn
            .query(
                &conn
                    .prepare_cached(
                        "SELECT n.gpu_type, n.leaf, count(*) AS nodes,
                                coalesce(sum(cardinality(n.usable)) FILTER (WHERE o.open), 0)::bigint
                                    AS schedulable,
                                coalesce(sum(l.taken), 0)::bigint AS allocated,
                                coalesce(sum((SELECT count(*) FROM unnest(n.usable) AS u(g)
                                              WHERE g <> ALL (coalesce(l.held, '{}'))))
                                    FILTER (WHERE o.open), 0)::bigint AS free,
                                coalesce(sum((SELECT count(*) FROM gpus g WHERE g.node_id = n.node_id))
                                    FILTER (WHERE n.spare), 0)::bigint AS spare
                         FROM nodes n
                         JOIN agents a ON a.agent_id = n.agent_id
                         JOIN (SELECT leaf, bool_or(rack_throttled) AS throttled
                               FROM nodes GROUP BY leaf) t ON t.leaf = n.leaf
                         LEFT JOIN (SELECT node_id, count(*) AS taken, array_agg(gpu_index) AS held
                                    FROM allocations WHERE released_at IS NULL
                                    GROUP BY node_id) l ON l.node_id = n.node_id
                         CROSS JOIN LATERAL (
                             SELECT NOT n.spare AND NOT t.throttled AND n.cluster_id IS NULL
                                    AND a.last_sync_at > now() - make_interval(secs => $1) AS open
                         ) o
                         GROUP BY n.gpu_type, n.leaf ORDER BY n.gpu_type, n.leaf",
                    )
                    .await?,
                &[&timeout_s],
            )
            .await?;
        // What budgeted racks can still feed, per (rack, type).
        let power_rows = rack_power_rows(&**conn).await?;
        let feeds = gpus_fed(&power_rows);
        let n = |r: &tokio_postgres::Row, c: &str| r.get::<_, i64>(c) as u32;
        let mut caps: Vec<GpuTypeCapacity> = Vec::new();
        for r in &rows {
            let ty: String = r.get("gpu_type");
            let leaf: String = r.get("leaf");
            let mut free = n(r, "free");
            if let Some(&fed) = feeds.get(&(leaf, ty.clone())) {
                free = free.min(u32::try_from(fed).unwrap_or(u32::MAX));
            }
            if caps.last().is_none_or(|c| c.gpu_type != ty) {
                caps.push(GpuTypeCapacity {
                    gpu_type: ty,
                    nodes: 0,
                    schedulable: 0,
                    allocated: 0,
                    free: 0,
                    spare: 0,
                    queued: 0,
                });
            }
            let c = caps.last_mut().expect("just pushed");
            c.nodes += n(r, "nodes");
            c.schedulable += n(r, "schedulable");
            c.allocated += n(r, "allocated");
            c.free += free;
            c.spare += n(r, "spare");
        }
        // The shared pools' backlog, by type (`jobs_active`).
        for r in conn
            .query(
                "SELECT gpu_type, sum(gpus)::bigint FROM jobs
                 WHERE state = 'queued' AND cluster_id IS NULL GROUP BY gpu_type",
                &[],
            )
            .await?
        {
            let ty: String = r.get(0);
            if let Some(c) = caps.iter_mut().find(|c| c.gpu_type == ty) {
                c.queued = u32::try_from(r.get::<_, i64>(1)).unwrap_or(u32::MAX);
            }
        }
        let counts = conn
            .query_one(
                "SELECT count(*) FILTER (WHERE state = 'queued'),
                        count(*) FILTER (WHERE state IN ('starting', 'running', 'cancelling'))
                 FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')",
                &[],
            )
            .await?;
        Ok((
            caps,
            counts.get::<_, i64>(0) as u64,
            counts.get::<_, i64>(1) as u64,
        ))
    }
}

/// A read-only transaction on one snapshot (repeatable read): what a
/// scheduling pass, or a look at whether one is needed, reads.
async fn read_only_snapshot(
    conn: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>> {
    Ok(conn
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}
