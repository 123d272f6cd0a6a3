//! The region's PostgreSQL store: the source of truth for the region.
//!
//! # What is persisted, and why
//! - `sched_state.generation`: the region's scheduling generation, moved
//!   by every change to what may be scheduled (nodes, their states, spares,
//!   maintenance). `sched_partitions.version`: per pool (a GPU type's shared pool,
//!   or a dedicated cluster's, `cluster:<id>`: `pool_of` in
//!   `regional/sql/functions.sql`), the partition's
//!   version, moved by every plan that places or preempts on that type
//!   (and by every capacity reservation admitted for it). A
//!   plan records both as it read them and commits only if both are still
//!   current for what it decides, so a stale plan (another scheduler of the
//!   same type won the race, or the fleet changed) is rejected whole, while
//!   plans for different types commit independently. `placement_seq`
//!   numbers placing commits (`allocations.placement_seq`), so a job's newest
//!   run is the one with the highest number.
//! - `jobs` and `workers`: tenants' intent (the accepted spec, kept verbatim
//!   for idempotent retries) and each worker's progress. Idempotency keys are
//!   unique per tenant; a keyed job's id is derived from (tenant, key).
//! - `allocations`: one row per GPU per placement, live until released. A
//!   partial unique index forbids two live rows on one GPU (invariant 1);
//!   released rows are the allocation intervals that metering bills.
//! - `job_events`: the timeline tenants read.
//! - `agents`, `nodes`, `gpus`: the fleet as agents registered it, plus the
//!   operator's intent per node (`operator_state`). Liveness is the agent's
//!   last sync; an agent can always tell us again what it has. Who holds an
//!   agent's nodes (`agents.host_id`, `claim_released`) is kept so that a
//!   second claimant is refused while the first is alive.
//! - `inventory` (`inventory.rs`): which machines belong to the region,
//!   where each sits and which agent may serve it — operator intent (the
//!   fleet file, `admin node add`/`admit`), which agents cannot tell us.
//!   `unknown_nodes`: machines refused as not in it, listed for operators;
//!   they tell us again by retrying.
//! - `quotas`: operator-set terms per tenant and GPU type: guaranteed GPUs,
//!   fair-share weight (thousandths) and an optional cap.
//! - `jobs.min_workers`, `jobs.run_workers`, `jobs.grows`: an elastic
//!   gang's minimum; how many workers (ranks 0 … n−1) its current run was
//!   placed with, which decides which workers make the run and the world
//!   size agents are told; how many of its preemptions were restarts to
//!   grow (not counted against the cap on priority preemptions).
//! - `jobs.node_moves`: how many of its preemptions were moves for a
//!   node's sake (drain, health, lost node, maintenance, a fenced agent);
//!   like `grows`, not counted against that cap.
//! - `jobs.checkpointed_at`, `jobs.preempted_for`: what preemption decides
//!   from (work at risk since the last checkpoint; a preemption in flight and
//!   whom it makes room for, so a later pass does not pick more victims).
//!   Decayed past usage is not stored: it is computed from `allocations`.
//! - Node operations (`nodes.rs`, `audit.rs`): what operators asked of each
//!   node (`operator_state` with its reason and drain deadline: operator
//!   intent, which nothing else can tell us again), what its signals add up
//!   to (`nodes.health`, the health policy's memory of faults, quarantines,
//!   flaps and failures, which agents cannot report again once seen), its
//!   machine boot id, the node's timeline (`node_events`), jobs moved for a
//!   node's sake (`jobs.requeue_front`), and `audit_log`: every operator
//!   action, append-only, written in the action's transaction.
//! - Spare swaps (`spares.rs`): `nodes.spare_managed` (the region changed
//!   the spare flag, registration keeps it), `nodes.refill_spare` (swapped
//!   out: back to the pool when repaired), and `gpu_holds`: the GPUs a gang
//!   moving onto a spare is placed on once its workers are down — intent
//!   nothing else records, so it must survive a restart in between.
//! - `jobs.lost_gpu_s`: GPU-seconds of work lost to restarts (after the last
//!   checkpoint), counted when each run ends in a requeue: the allocation
//!   intervals say what was allocated, not what was lost. Goodput is
//!   computed from both.
//! - `maintenance_plans`, `maintenance_steps`: rolling maintenance, one
//!   row per node with its step and its boot id when told to reboot, so a
//!   control plane restarted mid-way resumes the waves where they were;
//!   for a node skipped (out of service for another reason at its turn)
//!   why (`reason`), and for one waited for (out for a passing reason at
//!   its turn) since when (`waiting_since`), so a restart neither forgets
//!   a skip nor restarts a wait.
//! - `tenant_limits` (`limits.rs`): operator-set admission limits per
//!   tenant — queued jobs at most, GPUs of unfinished jobs at most (NULL:
//!   no limit on that dimension). Operator intent, like `quotas`, which
//!   nothing else can tell us again. What they are checked against is not
//!   stored: it is counted from `jobs` (index `jobs_unfinished_by_tenant`)
//!   under a per-tenant advisory lock when a limited tenant submits.
//! - Power (`V12`): `nodes.gpu_power_w` (what one allocated GPU of the
//!   node draws) and `nodes.rack_power_budget_w` (its rack's budget for
//!   GPU draw) as its agent registered them (NULL: unknown, no budget), so
//!   an agent tells us them again at every registration. A rack's budget is
//!   the smallest its nodes report; what it draws is not stored, it is
//!   counted from the live allocations and holds (`power.rs`).
//!   `nodes.rack_throttled`: the node's latest `RackThermal` report (or
//!   injected fault) that its rack throttles; every node of that leaf is
//!   then unschedulable. Kept because a report says it only when it
//!   changes.
//! - Capacity reservations (`V13`, `reservations.rs`):
//!   `capacity_reservations`, one row per promise a tenant was made: GPUs
//!   of a type inside the domain admission pinned it to (`level`, `path`),
//!   for `[start_at, end_at)` (NULL end: open-ended), `active` or
//!   `deleted` (kept, so its jobs and retries still resolve). Tenant intent
//!   and the region's promise, which nothing else can tell us again. A
//!   keyed create's id is derived from (tenant, key) and the accepted
//!   request kept for retries, like jobs; keyed resizes and deletes are
//!   recorded in `reservation_requests` (key, reservation, operation,
//!   request), so a retry is answered without doing it again. Admissions
//!   are serialised per region by a transaction-level advisory lock.
//!   `jobs.reservation_id`: the reservation a job runs in (NULL: ordinary
//!   work), checked at submission. What a reservation's jobs hold is not
//!   stored: it is counted from the live allocations.
//! - Dedicated clusters (`V14`, `clusters/`): `clusters`, one row per
//!   cluster a tenant asked for (GPU type, nodes asked, the level and the
//!   domain its nodes lie in, `active` / `deleting` / `deleted`, the
//!   accepted request for keyed retries); `nodes.cluster_id`, which
//!   cluster a node is bound to (the region's decision, which agents cannot
//!   tell us again; a member is never a spare and is `spare_managed`),
//!   `nodes.cluster_release` (being given back by a shrink until its jobs
//!   are off); `jobs.cluster_id`, the cluster a job runs on;
//!   `cluster_requests`, keyed resizes and deletes; `cluster_events`, the
//!   timeline the tenant reads (created, resized, a node failed, a spare
//!   swapped in or none free, nodes given back, deleted). The state people
//!   see (ready, degraded, resizing) is not stored: it is derived from the
//!   members. Clusters' pool keys (`cluster:<id>`) share
//!   `sched_partitions.pool` with the GPU types'.
//! - Regions watching each other (`V16`, `replicas.rs`, docs/failover.md):
//!   `peer_leases` (per peer: our last round trip to it, its last
//!   heartbeat to us, and what it hears of every region — what fencing and
//!   adoption decide from, on the database's clock so every replica sees
//!   the same); `replica_jobs` (other regions' job intent we hold as their
//!   buddy: the only copy of an acknowledged job outside its home);
//!   `job_moves` (adoptions we recorded for an adopter, read back by a
//!   returning home); `jobs.epoch` (ownership epoch), `jobs_awaiting_buddy`
//!   (not acknowledged nor scheduled until a buddy holds its intent),
//!   `jobs.buddy`, `buddy_told_*` and `buddy_dirty_since` (what the buddy
//!   was told, and since when it lags: a trigger keeps it),
//!   `jobs.adopted_from`, `jobs.moved_to`.
//!
//! - Checkpoints (`V15`, `checkpoints.rs`): `checkpoints`, one row per
//!   checkpoint committed to the region's checkpoint store (its manifest
//!   written) that an agent reported: job, epoch, seq, attempt, key, size,
//!   digest, when, by whom. Agents report each only until a sync carrying it
//!   succeeds, so this is the region's only memory of them (the store could
//!   be listed again, but the epoch check happened here).
//!   `jobs.restore_from` caches the newest one's key (highest epoch, seq,
//!   attempt) for assignments and the buddy. `jobs.epoch`: the job's
//!   ownership epoch (also V16's), which checkpoints must carry.
//!
//! - Planned evacuation and fail back (`V17`, `handovers.rs`,
//!   docs/failover.md): `region_evacuation` (what the operator asked of
//!   the region — evacuating, evacuated, failing back — operator intent
//!   that must survive restarts), `jobs.handover_to` / `handover_cause`
//!   (the durable marker a planned move is advanced from, step by step,
//!   so a crash anywhere resumes it; a marked job is never placed here),
//!   `job_moves.planned` (the move was the home's own), and `handovers`
//!   (what moved out and in, that progress is counted from).
//!
//! - The usage ledger (`V18`, `V19`, `usage.rs`, docs/billing.md):
//!   `usage_ledger`, append-only, one row per placement and clock hour,
//!   written by the database (a trigger on `allocations` and
//!   `record_placement`); `usage_credits`, one per usage row a
//!   provider-caused end lost work in (after the job's newest checkpoint),
//!   under the causes `usage_credit_causes` lists (the region's policy);
//!   `usage_outbox` and `usage_credit_outbox`, what the job's buddy does
//!   not hold yet; `region_meta` (the region's name for rows the database
//!   writes, and `metered_until`: every live placement has its rows for
//!   the hours before it). The only record of what was billed: allocations
//!   say what was held, not what a bill was made of. `V20`: the rows'
//!   `reservation_id` / `cluster_id`; corrections (cause `correction` in
//!   `usage_credits`) of rows a back-dated release reaches behind; and
//!   `commitment_history`, every version of every guaranteed quota,
//!   reservation and cluster, written by triggers (committed capacity).
//!
//! # Layout
//! - `mod.rs`: the [`Store`], connection pool, migrations (then the SQL
//!   functions' live bodies, `regional/sql/functions.sql`), [`StoreError`].
//! - `jobs.rs`: submit, get, list, cancel, events.
//! - `limits.rs`: per-tenant admission limits: the check a limited
//!   tenant's submit (and dry run) makes, and listing them.
//! - `agents.rs`: agent registration and sync (reports in, assignments out).
//! - `checkpoints.rs`: recording the checkpoints agents report (epoch
//!   checked) and moving each job's restore point to its newest.
//! - `plans.rs`: the scheduler's snapshot (throttled racks included), the
//!   fleet's shape and capacity.
//! - `apply.rs`: the commit of a plan, checked against the region's
//!   generation and its pools' versions (`apply_plan`).
//! - `power.rs`: rack power as the snapshot reads it: each rack's draw
//!   against its budget, and each pool's share of the headroom.
//! - `rows.rs`: row → domain conversions.
//! - `usage.rs`: the usage ledger and its credits (the meter, reads,
//!   replication to buddies), a tenant's usage from them, and what
//!   reconciliation compares them with.
//! - `nodes.rs`: node health from syncs and the clock, operators' node
//!   actions and injected faults, and what both decide (evacuate, lost).
//! - `audit.rs`: the audit log, and the audited quota, limits and preempt
//!   actions.
//! - `spares.rs`: spare swaps under failed nodes, held GPUs, refills.
//! - `maintenance.rs`: rolling maintenance plans and the leader's tick.
//! - `reservations.rs`: capacity reservations: admission (create,
//!   resize) under the region's lock, reads, deletes, and the check a job
//!   naming one makes.
//! - `replicas.rs`: other regions' job intent, leases, adoption, and a
//!   returning region learning which of its jobs moved.
//! - `handovers.rs`: planned moves: the evacuation row, handover markers,
//!   the point of no return, the taker's side (reviving a released copy)
//!   and the releaser's, and progress.
//! - `pg_tls.rs`: the connection URL, and TLS to PostgreSQL when it asks
//!   (`sslmode=verify-full`, `sslrootcert`).
//! - `keyed.rs`: idempotency keys of reservations' and clusters' creates
//!   and keyed changes.
//! - `clusters/`: dedicated clusters — `mod.rs`: create, resize and
//!   delete (all or nothing), reads, pool keys, and the check a job naming
//!   one makes; `choice.rs`: which nodes a cluster takes or gives back
//!   (pure); `tend.rs`: the leader's tend and healing failed members from
//!   spares of the domain.
//!
//! These files import nothing above the database layer (no HTTP, no
//! other region, no loop). Among themselves, seven call each other's
//! transaction helpers, because one transaction does what they each
//! describe: a submit checks the job's cluster and reservation
//! (`jobs` → `clusters`, `reservations`); a node that fails preempts its
//! jobs, heals its cluster and swaps a spare in (`nodes` → `jobs`,
//! `clusters`, `spares`); a swap places the held gangs with the plan
//! commit's own code (`spares` → `apply` → `jobs`); a snapshot reads the
//! nodes' decisions and pool keys (`plans` → `nodes`, `clusters`). That
//! circle — apply, clusters, jobs, nodes, plans, reservations, spares — is
//! the one left in `regional/src`, inside one layer and one `Store`.

mod agents;
mod apply;
mod audit;
mod checkpoints;
pub mod closings;
mod clusters;
pub mod commitment_copies;
pub mod handovers;
mod identity;
mod inventory;
mod jobs;
mod keyed;
mod limits;
mod logs;
mod maintenance;
mod nodes;
mod pg_tls;
mod plans;
mod power;
mod queue;
pub mod replicas;
mod reservations;
mod rows;
mod scale;
mod spares;
mod usage;
pub mod wakes;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;

pub use agents::{StopTiming, SyncOutcome};
pub use apply::ApplyOutcome;
pub use audit::Who;
pub use checkpoints::{Recorded, Refusal};
pub use clusters::{cluster_of_key, job_pool, pool_key, ClusterOutcome, NewCluster, TendOutcome};
pub use inventory::InventoryNode;
pub use jobs::{ListFilter, NewJob, SubmitOutcome};
pub use maintenance::MaintenanceRefusal;
pub use nodes::{AdminChange, HealthContext, NodeRefusal, NodesOutcome};
pub use pg_tls::PgTarget;
pub use plans::{FleetShape, Outlook, QueuePlace, QueueRead, SnapshotData};
pub use power::RackPower;
pub use reservations::{NewReservation, ReservationOutcome};
pub(crate) use rows::level_of;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Advisory lock key held while migrations run ("gangway-migrate").
const MIGRATION_LOCK_KEY: i64 = 0x6761_6e67_6d69_6772;

/// The live body of every SQL function, applied after the versioned
/// migrations (`CREATE OR REPLACE`): the one place a function is written.
pub const FUNCTIONS_SQL: &str = include_str!("../../sql/functions.sql");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The statement failed; whether it applied depends on `maybe_applied`.
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("no database connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("migrations failed: {0}")]
    Migration(String),
    #[error("not found")]
    NotFound,
    /// An idempotency key was used before with a different spec.
    #[error("idempotency key reused with a different spec")]
    KeyReused,
    /// The agent is not registered (it should register again).
    #[error("unknown agent")]
    UnknownAgent,
    /// Another request with the same idempotency key is being handled right
    /// now; retry shortly.
    #[error("a request with this idempotency key is in flight")]
    InFlight,
    /// A create asked to claim its key here found another region's claim
    /// ([`Store::submit_claiming`]); nothing was written.
    #[error("this idempotency key is claimed for another region")]
    ClaimedElsewhere,
    /// The report comes from an earlier boot of the agent.
    #[error("report from an earlier boot")]
    StaleBoot,
    /// The caller may not do this (a stable code and why: a machine not in
    /// the inventory, a node bound to another agent); nothing was written
    /// but the refusal's own record (`unknown_nodes`).
    #[error("{message}")]
    Refused { code: &'static str, message: String },
    /// The plan's generation is no longer current, or one of its placements
    /// no longer applies; nothing was written.
    #[error("stale plan: {0}")]
    StalePlan(String),
    /// A capacity reservation that cannot be honoured; nothing was
    /// written. `earliest`: the earliest window of the same length that
    /// would work (start, end; `None` end: open-ended), if any.
    #[error("reservation refused: {why}")]
    ReservationRefused {
        why: String,
        earliest: Option<(
            chrono::DateTime<chrono::Utc>,
            Option<chrono::DateTime<chrono::Utc>>,
        )>,
    },
    /// The request is invalid given what the store holds (a stable code of
    /// `gangway_shared::error::codes` and what to fix); nothing was written.
    #[error("{message}")]
    Invalid { code: &'static str, message: String },
    /// The object's state does not allow the change (a stable code and
    /// why); nothing was written.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// Admitting the job would leave the tenant with more queued jobs in
    /// the region than its limit; nothing was written.
    #[error("{queued} queued job(s) in region {region}, at the limit of {limit}")]
    QueuedJobsLimit {
        region: String,
        limit: u32,
        /// The tenant's jobs queued now.
        queued: u64,
    },
    /// Admitting the job would make its tenant's unfinished jobs in the
    /// region ask for more GPUs than its limit; nothing was written.
    #[error("{job_gpus} GPUs asked on top of {unfinished_gpus} in region {region}, over the limit of {limit}")]
    RequestedGpusLimit {
        region: String,
        limit: u32,
        /// GPUs the tenant's unfinished jobs ask for now.
        unfinished_gpus: u64,
        /// GPUs the refused job asks for.
        job_gpus: u64,
    },
}

impl StoreError {
    /// Whether this error is a lost serialization race that is safe to retry.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Db(e) => matches!(
                e.code(),
                Some(&SqlState::T_R_SERIALIZATION_FAILURE) | Some(&SqlState::T_R_DEADLOCK_DETECTED)
            ),
            _ => false,
        }
    }

    /// Whether the database is unreachable (as opposed to a query bug):
    /// no connection, a connection that broke, or a server that is going
    /// away or is not the primary (any longer): what a failover looks like
    /// from here, while the pools' next connections find the new primary
    /// (`pg_tls.rs`). Worth a retry shortly, unlike a query's error.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(_) => true,
            StoreError::Db(e) => e.is_closed() || e.code().is_none_or(failing_over),
            _ => false,
        }
    }
}

/// The SQLSTATEs of a server failing over: a connection exception (class
/// 08), a server shutting down or crashed (an administrator's or Patroni's
/// stop, a crash: 57P01, 57P02), starting up or in recovery (57P03), and a
/// write refused by a standby (25006: a connection opened to the primary
/// that has since been demoted).
fn failing_over(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ]
        .contains(code)
}

pub use gangway_shared::api::{Quota, QuotaTerms};

/// A `quotas` row as the API shows it.
fn quota_from_row(r: &tokio_postgres::Row) -> Quota {
    Quota {
        tenant: r.get("tenant"),
        gpu_type: r.get("gpu_type"),
        guaranteed_gpus: r.get::<_, i32>("guaranteed_gpus").max(0) as u32,
        max_gpus: r.get::<_, Option<i32>>("max_gpus").map(|m| m.max(0) as u32),
        weight: f64::from(r.get::<_, i32>("weight")) / 1000.0,
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Runs `op` again (at most three more times, with a short backoff) when it
/// lost a serialization or deadlock race, which rolls back and is safe to
/// repeat. Anything else is returned as it is.
pub async fn retry_races<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0u32;
    loop {
        match op().await {
            Err(e) if e.is_retryable() && attempt < 3 => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "retrying after a lost race");
                tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
            }
            other => return other,
        }
    }
}

/// One region's store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// Two connections of their own for the peers' leases (heartbeats in
    /// and out, the fencing decision) and the agents' batched liveness, so
    /// that they never queue behind syncs, submissions or a scheduling pass
    /// on the main pool.
    leases: Pool,
    /// The agents' syncs' own connections (as many as the main pool's), so
    /// a sync never waits behind submissions, listings or a scheduling
    /// pass for a connection: a sync is how running work is heard. (Half
    /// as many were too few at 40,960 GPUs: 320 agents' syncs waited up to
    /// the pool's 10 s, and nodes went suspect.)
    syncs: Pool,
    region: String,
    /// Decayed past usage, reused for a while (see `plans.rs`).
    history: Arc<Mutex<Option<plans::HistoryCache>>>,
    /// Every node's GPUs, reused while the fleet's version stands
    /// (`plans.rs`).
    fleet_gpus: Arc<Mutex<Option<Arc<plans::FleetGpus>>>>,
    /// Each pool's queue, brought up to date by each pass (`queue.rs`).
    queues: Arc<queue::Queues>,
    /// The last health tick held silent nodes in a mass silence
    /// (`nodes.rs`): when it ends, the nodes still silent get their lost
    /// countdown back. In memory: a new leader starts without it.
    mass_silence: Arc<std::sync::atomic::AtomicBool>,
    /// The node-health policy the snapshot decides nodes with, and the
    /// checkpoint deadline a `wait` drain past its deadline gives its jobs.
    health: Arc<gangway_health::HealthPolicy>,
    checkpoint_deadline_s: u64,
    /// The region has peers: a new job waits for a buddy to hold its
    /// intent before it is acknowledged or scheduled (`replicas.rs`).
    replicating: bool,
    /// How long an agent that stopped syncing still holds its nodes
    /// against another claimant (its lease).
    claim_lease: Duration,
    /// Agents heard by quiet syncs, their liveness written together
    /// (`agents.rs`).
    liveness: Arc<agents::Liveness>,
    /// Agents' long polls for changes to their assignments (`wakes.rs`).
    wakes: Arc<wakes::AgentWakes>,
    /// The scale of the tables the agents' reads join, for their plans
    /// (`scale.rs`).
    scale: Arc<scale::TableScale>,
}

/// Callers waiting for a connection of a pool beyond what its full size
/// holds. (deadpool counts a caller that is opening one of the pool's
/// connections as waiting: that one is not queueing.)
pub fn queued_callers(s: &deadpool_postgres::Status) -> usize {
    (s.size + s.waiting).saturating_sub(s.max_size)
}

/// A connection of `pool`, the wait recorded under its `name`
/// (`gangway_db_pool_wait_seconds`).
async fn timed_get(pool: &Pool, name: &'static str) -> Result<deadpool_postgres::Object> {
    let asked = std::time::Instant::now();
    let conn = pool.get().await;
    metrics::histogram!("gangway_db_pool_wait_seconds", "pool" => name)
        .record(asked.elapsed().as_secs_f64());
    Ok(conn?)
}

/// `sql` prepared once per connection (deadpool's statement cache), for
/// the statements a region runs many times a second (an agent's sync):
/// PostgreSQL parses and plans it once, and each use is one round trip.
pub(super) async fn cached(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
) -> Result<tokio_postgres::Statement> {
    Ok(tx.prepare_cached(sql).await?)
}

impl Store {
    /// Connects to `url` (a libpq-style connection string) with a pool of
    /// `max_size` connections, as many again for the agents' syncs and two
    /// for the leases (each opened as needed). Does not touch the schema.
    pub fn connect(url: &str, region: &str, max_size: usize) -> anyhow::Result<Store> {
        let target = PgTarget::parse(url)?;
        let manager = || {
            let config = ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            };
            // Each new connection to the member that takes writes,
            // staggered over the URL's members (pg_tls.rs).
            let connect = pg_tls::PoolConnect(target.clone());
            Manager::from_connect(target.config.clone(), connect, config)
        };
        // At most `size` connections; a caller waits up to `wait_s` for one.
        let pool = |size: usize, wait_s: u64| {
            Pool::builder(manager())
                .max_size(size)
                .wait_timeout(Some(Duration::from_secs(wait_s)))
                .create_timeout(Some(Duration::from_secs(wait_s.min(5))))
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
        };
        let (main, syncs) = (pool(max_size, 10)?, pool(max_size, 10)?);
        // A lease read or write that waits longer than a heartbeat's round
        // trip may is as good as failed.
        let leases = pool(2, 2)?;
        Ok(Store {
            pool: main,
            leases,
            syncs,
            region: region.to_string(),
            history: Arc::new(Mutex::new(None)),
            fleet_gpus: Arc::new(Mutex::new(None)),
            queues: Arc::default(),
            wakes: Arc::default(),
            scale: Arc::default(),
            mass_silence: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            health: Arc::new(gangway_health::HealthPolicy::default()),
            checkpoint_deadline_s: 120,
            replicating: false,
            claim_lease: Duration::from_secs(60),
            liveness: Arc::default(),
        })
    }

    /// Decides nodes with `policy` rather than the crate's defaults; a
    /// `wait` drain past its deadline gives its jobs `checkpoint_deadline`.
    pub fn with_health(
        mut self,
        policy: gangway_health::HealthPolicy,
        checkpoint_deadline: Duration,
    ) -> Store {
        self.health = Arc::new(policy);
        self.checkpoint_deadline_s = checkpoint_deadline.as_secs();
        self
    }

    /// New jobs wait for a buddy region to hold their intent before they
    /// are acknowledged or scheduled (a region with peers).
    pub fn with_replication(mut self, replicating: bool) -> Store {
        self.replicating = replicating;
        self
    }

    /// An agent silent for `lease` no longer holds its nodes against
    /// another claimant (the agents' lease: by then it has fenced).
    pub fn with_claim_lease(mut self, lease: Duration) -> Store {
        self.claim_lease = lease;
        self
    }

    pub fn replicating(&self) -> bool {
        self.replicating
    }

    /// The node-health policy in force.
    pub fn health_policy(&self) -> &gangway_health::HealthPolicy {
        &self.health
    }

    /// What node-health work needs: the policy, and the checkpoint
    /// deadline workers get.
    pub fn health_context(&self) -> HealthContext {
        HealthContext {
            policy: (*self.health).clone(),
            checkpoint_deadline_s: self.checkpoint_deadline_s,
        }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub(crate) async fn conn(&self) -> Result<deadpool_postgres::Object> {
        timed_get(&self.pool, "main").await
    }

    /// A connection of the agents' syncs' own pool ([`Store::syncs`]).
    pub(crate) async fn sync_conn(&self) -> Result<deadpool_postgres::Object> {
        timed_get(&self.syncs, "syncs").await
    }

    /// The agents' long polls for changes to their assignments.
    pub fn agent_wakes(&self) -> &wakes::AgentWakes {
        &self.wakes
    }

    /// A connection of the peers' leases' own pool ([`Store::leases`]).
    pub(crate) async fn lease_conn(&self) -> Result<deadpool_postgres::Object> {
        timed_get(&self.leases, "leases").await
    }

    /// The main pool now: its size, connections idle, and callers waiting
    /// for one (what shedding decides from, `api/shed.rs`).
    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// The agents' syncs' pool now (shedding, `api/shed.rs`, gives way to
    /// syncs that queue).
    pub fn sync_pool_status(&self) -> deadpool_postgres::Status {
        self.syncs.status()
    }

    /// Applies the embedded migrations, then the SQL functions' live
    /// bodies (`regional/sql/functions.sql`), under an advisory lock, so
    /// replicas starting together migrate once. Safe to run on every start.
    pub async fn migrate(&self) -> Result<()> {
        let mut conn = self.conn().await?;
        conn.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
            .await?;
        let client: &mut tokio_postgres::Client = &mut conn;
        let result = match embedded::migrations::runner().run_async(client).await {
            Ok(_) => (client.batch_execute(FUNCTIONS_SQL).await)
                .map_err(|e| StoreError::Migration(format!("regional/sql/functions.sql: {e}"))),
            Err(e) => Err(StoreError::Migration(e.to_string())),
        };
        conn.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
            .await?;
        result?;
        // Rows the database writes itself (the usage ledger) name the region.
        conn.execute(
            "INSERT INTO region_meta (name) VALUES ($1)
             ON CONFLICT (only_row) DO UPDATE SET name = EXCLUDED.name",
            &[&self.region()],
        )
        .await?;
        Ok(())
    }

    /// Sets (replaces) a tenant's terms for one GPU type: guarantee, cap
    /// and weight, as checked by [`gangway_shared::api::QuotaUpdate::check`].
    pub async fn set_quota(&self, tenant: &str, gpu_type: &str, terms: &QuotaTerms) -> Result<()> {
        let conn = self.conn().await?;
        let max = terms.max_gpus.map(|m| m as i32);
        conn.execute(
            "INSERT INTO quotas (tenant, gpu_type, guaranteed_gpus, max_gpus, weight)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (tenant, gpu_type) DO UPDATE
               SET guaranteed_gpus = EXCLUDED.guaranteed_gpus, max_gpus = EXCLUDED.max_gpus,
                   weight = EXCLUDED.weight",
            &[
                &tenant,
                &gpu_type,
                &(terms.guaranteed_gpus as i32),
                &max,
                &(terms.weight_milli as i32),
            ],
        )
        .await?;
        Ok(())
    }

    /// Every quota, ordered by tenant and GPU type.
    pub async fn list_quotas(&self) -> Result<Vec<Quota>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT tenant, gpu_type, guaranteed_gpus, max_gpus, weight FROM quotas
                 ORDER BY tenant, gpu_type",
                &[],
            )
            .await?;
        Ok(rows.iter().map(quota_from_row).collect())
    }

    /// Removes a cap; returns whether there was one.
    pub async fn delete_quota(&self, tenant: &str, gpu_type: &str) -> Result<bool> {
        let conn = self.conn().await?;
        let n = conn
            .execute(
                "DELETE FROM quotas WHERE tenant = $1 AND gpu_type = $2",
                &[&tenant, &gpu_type],
            )
            .await?;
        Ok(n > 0)
    }

    /// Records that the keyed create `job_id` goes to `region`, unless an
    /// earlier claim said otherwise; returns the region that won.
    pub async fn claim(&self, job_id: uuid::Uuid, tenant: &str, region: &str) -> Result<String> {
        let conn = self.conn().await?;
        let claim = conn
            .prepare_cached(
                "WITH ins AS (
                     INSERT INTO idempotency_claims (job_id, tenant, region) VALUES ($1, $2, $3)
                     ON CONFLICT (job_id) DO NOTHING RETURNING region)
                 SELECT region FROM ins
                 UNION ALL
                 SELECT region FROM idempotency_claims WHERE job_id = $1 AND tenant = $2
                 LIMIT 1",
            )
            .await?;
        let row = conn.query_one(&claim, &[&job_id, &tenant, &region]).await?;
        Ok(row.get(0))
    }

    /// The current scheduling generation.
    pub async fn generation(&self) -> Result<i64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one("SELECT generation FROM sched_state WHERE id = 1", &[])
            .await?;
        Ok(row.get(0))
    }
}
