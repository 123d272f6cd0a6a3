//! Agents: registration (the machines agents serve, placed where the
//! region's inventory says, one claimant at a time) and sync (worker
//! reports in, assignments out).

use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};

use gangway_shared::agent::{
    AgentNode, Assignment, Desired, RegisterRequest, SyncRequest, WorkerReport, WorkerStatus,
};
use gangway_shared::api::JobSpec;
use gangway_shared::error::codes;
use serde_json::json;
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;
use uuid::Uuid;

use super::inventory::InventoryNode;
use super::jobs::{insert_event, lock_jobs};
use super::scale::TableScale;
use super::{Result, Store, StoreError};

/// What a sync did.
#[derive(Clone, Debug, Default)]
pub struct SyncOutcome {
    pub assignments: Vec<Assignment>,
    /// GPUs were released: the scheduler has new room.
    pub freed_gpus: bool,
    /// The reported checkpoints recorded and refused.
    pub checkpoints: super::Recorded,
    /// Nothing reported changed anything: the sync only read.
    pub quiet: bool,
    /// Reports left for the agent's next sync: their jobs were held.
    pub deferred: bool,
}

/// The port rank 0 listens on for the gang's rendezvous, derived from the
/// job id so every worker computes the same one.
pub fn master_port(job_id: Uuid) -> u16 {
    let b = job_id.as_bytes();
    20_000 + (u16::from_be_bytes([b[0], b[1]]) % 20_000)
}

impl Store {
    /// The nodes a registered agent serves ([`StoreError::UnknownAgent`]
    /// when it serves none: it must register first). On the syncs' pool.
    pub async fn agent_nodes(&self, agent_id: &str) -> Result<Vec<String>> {
        let conn = self.sync_conn().await?;
        let rows = conn
            .query(
                &conn
                    .prepare_cached("SELECT node_id FROM nodes WHERE agent_id = $1")
                    .await?,
                &[&agent_id],
            )
            .await?;
        if rows.is_empty() {
            return Err(StoreError::UnknownAgent);
        }
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Wakes the agents of `nodes` and of the nodes the workers of `jobs`
    /// are on (their polls of `changes`, `wakes.rs`): their assignments
    /// changed outside a plan — an operator's drain, an evacuation off a
    /// failing node — so they sync now, not at their next interval. Reads
    /// the jobs' nodes only while some agent is waiting.
    pub async fn wake_agents_of(&self, nodes: &[&str], jobs: &[Uuid]) -> Result<()> {
        let mut all: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        if !jobs.is_empty() && self.wakes.any_waiting() {
            let conn = self.conn().await?;
            let rows = conn
                .query(
                    &conn
                        .prepare_cached(
                            "SELECT DISTINCT node_id FROM workers
                             WHERE job_id = ANY($1::uuid[]) AND node_id IS NOT NULL",
                        )
                        .await?,
                    &[&jobs],
                )
                .await?;
            all.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        }
        self.wakes.wake(all.iter().map(String::as_str));
        Ok(())
    }

    /// Records an agent and its nodes, each where the region's inventory
    /// says it sits. Refused, with nothing written but the refusal's
    /// record: a node the inventory does not have (`unknown_node`, listed
    /// as unknown), one it binds to another agent (`wrong_agent`), one that
    /// reports another GPU type than it says (`node_mismatch`), and a new
    /// boot from another claimant while the agent's current boot is alive
    /// (`node_claimed`). Another claimant after the lease ran out, or after
    /// an operator released the claim, takes the nodes over (audited
    /// `node.takeover`). A new boot id means the agent's workers from
    /// before are gone: workers it was stopping are done, and the rest will
    /// be launched again from its assignments.
    pub async fn register_agent(&self, req: &RegisterRequest) -> Result<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let places = check_inventory(&tx, req).await?;
        let places = match places {
            Ok(p) => p,
            Err(refusal) => {
                // The refusal's own record commits: operators see the
                // machine as unknown.
                tx.commit().await?;
                return Err(refusal);
            }
        };
        // The previous boot, and the last time it was heard: its workers
        // are known to have run until then, not after.
        let previous = tx
            .query_opt(
                "SELECT boot_id, last_sync_at, host_id, claim_released,
                        last_sync_at > now() - make_interval(secs => $2) AS alive
                 FROM agents WHERE agent_id = $1 FOR UPDATE",
                &[&req.agent_id, &self.claim_lease.as_secs_f64()],
            )
            .await?;
        let last_heard: Option<DateTime<Utc>> = previous.as_ref().and_then(|r| r.get(1));
        if let Some(prev) = &previous {
            let (boot, host, released, alive): (Uuid, Option<String>, bool, bool) =
                (prev.get(0), prev.get(2), prev.get(3), prev.get(4));
            if boot != req.boot_id && host != req.host_id {
                if alive && !released {
                    return Err(StoreError::Conflict {
                        code: codes::NODE_CLAIMED,
                        message: format!(
                            "agent {} holds {} and is alive (last heard within its lease of {} s) \
                             on another machine or work directory: a second agent may not take \
                             its nodes. Stop it, wait for its lease to run out, or have an \
                             operator release the node (gangway admin node release NODE)",
                            req.agent_id,
                            node_list(req),
                            self.claim_lease.as_secs()
                        ),
                    });
                }
                let actor = format!("agent:{}", req.agent_id);
                let detail = json!({
                    "old_host": host, "new_host": req.host_id, "old_boot": boot,
                    "new_boot": req.boot_id, "released_by_operator": released,
                });
                for n in &req.nodes {
                    super::nodes::insert_audit(
                        &tx,
                        &actor,
                        "node.takeover",
                        &n.node_id,
                        Some(if released {
                            "an operator released the node"
                        } else {
                            "its previous agent's lease ran out"
                        }),
                        detail.clone(),
                    )
                    .await?;
                }
            }
        }
        let previous: Option<Uuid> = previous.map(|r| r.get(0));
        tx.execute(
            "INSERT INTO agents (agent_id, boot_id, executor, host_id) VALUES ($1, $2, $3, $4)
             ON CONFLICT (agent_id) DO UPDATE
               SET boot_id = EXCLUDED.boot_id, executor = EXCLUDED.executor,
                   host_id = EXCLUDED.host_id, claim_released = false,
                   registered_at = now(), last_sync_at = now()",
            &[&req.agent_id, &req.boot_id, &req.executor, &req.host_id],
        )
        .await?;
        tx.execute(
            "DELETE FROM unknown_nodes WHERE node_id = ANY($1)",
            &[&req
                .nodes
                .iter()
                .map(|n| n.node_id.as_str())
                .collect::<Vec<_>>()],
        )
        .await?;

        let node_ids: Vec<&str> = req.nodes.iter().map(|n| n.node_id.as_str()).collect();
        // The place is the inventory's; what is on the machine, the agent's.
        let spines: Vec<&str> = places.iter().map(|p| p.spine.as_str()).collect();
        let leaves: Vec<&str> = places.iter().map(|p| p.leaf.as_str()).collect();
        let domains: Vec<&str> = places.iter().map(|p| p.nvlink_domain.as_str()).collect();
        let spares: Vec<bool> = places.iter().map(|p| p.spare).collect();
        let types: Vec<&str> = req.nodes.iter().map(|n| n.gpu_type.as_str()).collect();
        let addrs: Vec<&str> = req.nodes.iter().map(|n| n.address.as_str()).collect();
        // Power figures as the agent knows them (NULL: unknown, no budget);
        // out-of-range ones are taken as unknown rather than refused. The
        // inventory's rack budget, where it has one, is the rack's.
        let draws: Vec<Option<i32>> = (req.nodes.iter())
            .map(|n| {
                n.gpu_power_w
                    .and_then(|w| i32::try_from(w).ok())
                    .filter(|&w| w > 0)
            })
            .collect();
        let budgets: Vec<Option<i64>> = (req.nodes.iter().zip(&places))
            .map(|(n, p)| {
                (p.rack_power_budget_w.or(n.rack_power_budget_w))
                    .and_then(|w| i64::try_from(w).ok())
                    .filter(|&w| w > 0)
            })
            .collect();
        tx.execute(
            "INSERT INTO nodes (node_id, agent_id, spine, leaf, nvlink_domain, gpu_type, address, spare,
                                gpu_power_w, rack_power_budget_w)
             SELECT n, $2, s, l, d, t, a, sp, pw, pb
             FROM unnest($1::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bool[],
                         $9::int[], $10::bigint[])
                  AS x(n, s, l, d, t, a, sp, pw, pb)
             ON CONFLICT (node_id) DO UPDATE
               SET agent_id = EXCLUDED.agent_id, spine = EXCLUDED.spine, leaf = EXCLUDED.leaf,
                   nvlink_domain = EXCLUDED.nvlink_domain, gpu_type = EXCLUDED.gpu_type,
                   address = EXCLUDED.address, gpu_power_w = EXCLUDED.gpu_power_w,
                   rack_power_budget_w = EXCLUDED.rack_power_budget_w,
                   -- the region's own swaps outlive re-registration
                   spare = CASE WHEN nodes.spare_managed THEN nodes.spare
                                ELSE EXCLUDED.spare END",
            &[
                &node_ids,
                &req.agent_id,
                &spines,
                &leaves,
                &domains,
                &types,
                &addrs,
                &spares,
                &draws,
                &budgets,
            ],
        )
        .await?;
        let mut g_nodes = Vec::new();
        let mut g_index = Vec::new();
        let mut g_uuid = Vec::new();
        let mut g_model = Vec::new();
        let mut g_memory = Vec::new();
        let mut g_pci = Vec::new();
        for n in &req.nodes {
            for g in &n.gpus {
                g_nodes.push(n.node_id.as_str());
                g_index.push(g.index as i32);
                g_uuid.push(g.uuid.as_str());
                g_model.push(g.model.as_deref());
                g_memory.push(g.memory_mib.and_then(|m| i64::try_from(m).ok()));
                g_pci.push(g.pci_bus_id.as_deref());
            }
        }
        tx.execute(
            "INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib, pci_bus_id)
             SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::bigint[],
                                  $6::text[])
             ON CONFLICT (node_id, gpu_index) DO UPDATE
               SET uuid = EXCLUDED.uuid, model = EXCLUDED.model,
                   memory_mib = EXCLUDED.memory_mib, pci_bus_id = EXCLUDED.pci_bus_id",
            &[&g_nodes, &g_index, &g_uuid, &g_model, &g_memory, &g_pci],
        )
        .await?;

        if previous.is_some_and(|p| p != req.boot_id) {
            // A new boot: the agent's workers died with the old one. Each
            // of its nodes loses them as a lost node does (the rest of each
            // gang checkpoints, the jobs requeue at the front, and are
            // placed again by the scheduler — which a fenced region does
            // not run, so a job that moved meanwhile never starts here);
            // their GPU time ends when the old boot was last heard.
            let nodes: Vec<String> = tx
                .query(
                    "SELECT DISTINCT w.node_id FROM workers w JOIN nodes n USING (node_id)
                     WHERE n.agent_id = $1
                       AND w.state IN ('assigned', 'running', 'checkpointing', 'stopping')
                     ORDER BY 1",
                    &[&req.agent_id],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            for node in &nodes {
                let why = "its agent restarted: the workers died with the old boot";
                super::nodes::lose_jobs_at(&tx, node, why, last_heard).await?;
            }
        }
        // Registering is a sign of life: each node is heard from, on the
        // machine boot it last reported (its first sync says which it is).
        let (ctx, boot) = (self.health_context(), req.boot_id.to_string());
        let look =
            super::nodes::look_at_nodes(&tx, &ctx, &req.agent_id, &boot, &[], &[], true).await?;
        super::nodes::observe_sync(&tx, &self.scale, &ctx, &boot, &[], true, look).await?;
        tx.execute(
            "UPDATE sched_state
             SET generation = generation + 1, fleet_version = fleet_version + 1 WHERE id = 1",
            &[],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Applies an agent's reports and returns what should run on its nodes.
    ///
    /// A sync costs what changed. It first looks without locks: at the
    /// agent (its boot), at its nodes ([`super::nodes::look_at_nodes`]) and
    /// at the workers it reports ([`look_at_reports`]). A quiet sync — its
    /// nodes heard from within a third of the suspect limit, no worker
    /// changed, no checkpoint — takes no lock and writes nothing: it reads
    /// the assignments and commits a transaction that wrote nothing (no WAL
    /// flush); the agent's liveness is written with other agents' a moment
    /// later ([`Liveness`]). Otherwise the agent's row is locked and its
    /// liveness written, the due nodes observed, and only the jobs of the
    /// workers whose report changes something are locked and written.
    pub async fn sync_agent(
        &self,
        agent_id: &str,
        req: &SyncRequest,
        timing: StopTiming,
    ) -> Result<SyncOutcome> {
        let mut conn = self.sync_conn().await?;
        let tx = conn.transaction().await?;
        let ctx = self.health_context();
        // An agent reports for its own nodes only: a report or checkpoint
        // naming another agent's node refuses the whole sync, before
        // anything of it is recorded (`look_at_nodes` checks, from the one
        // read of the agent's nodes it makes anyway).
        let mut named: Vec<&str> = (req.nodes.iter().map(|n| n.node_id.as_str()))
            .chain(req.checkpoints.iter().flatten().map(|c| c.node_id.as_str()))
            .collect();
        named.sort_unstable();
        named.dedup();
        let boot = req.boot_id.to_string();
        let uploads = req.checkpoints.is_some();
        // The three looks, sent at once and answered in order on the one
        // connection (tokio-postgres pipelines concurrent calls): one round
        // trip where one after the other took three, each a wait for both
        // processes to be scheduled again on a busy machine, holding a
        // connection the other syncs queue for. The nodes are looked at
        // with the boot the agent claims; a sync from another boot is
        // refused below, before anything is written. The answers are taken
        // in the order sent, so an unknown agent or a stale boot is told so
        // whatever the other reads found. (Reading the assignments with
        // them too saved a quiet sync another round trip, but read them
        // twice for each sync that changes something — a fifth of the syncs
        // under a burst, and the assignment read is the region's most
        // frequent statement: not done.)
        let (agent, nodes, changed) = tokio::join!(
            async {
                let read =
                    super::cached(&tx, "SELECT boot_id FROM agents WHERE agent_id = $1").await?;
                Ok::<_, StoreError>(tx.query_opt(&read, &[&agent_id]).await?)
            },
            super::nodes::look_at_nodes(&tx, &ctx, agent_id, &boot, &req.nodes, &named, false),
            look_at_reports(&tx, agent_id, &req.workers, uploads),
        );
        let agent = agent?.ok_or(StoreError::UnknownAgent)?;
        if agent.get::<_, Uuid>(0) != req.boot_id {
            return Err(StoreError::StaleBoot);
        }
        let (nodes, mut changed) = (nodes?, changed?);
        let checkpoints_reported = req.checkpoints.as_ref().is_some_and(|c| !c.is_empty());
        if nodes.due.is_empty() && changed.is_empty() && !checkpoints_reported {
            let assignments = load_assignments(&tx, &self.scale, agent_id, timing).await?;
            tx.commit().await?;
            self.liveness.heard(self, agent_id);
            return Ok(SyncOutcome {
                assignments,
                freed_gpus: false,
                checkpoints: Default::default(),
                quiet: true,
                deferred: false,
            });
        }
        // The sync before this one: a worker the agent stopped on its own
        // (it fenced, having lost us) ran until about then, as far as we
        // know (within a flush of `Liveness` if that one was quiet).
        let heard = (self.scale)
            .prepare(
                &tx,
                "UPDATE agents a SET last_sync_at = now()
                 FROM (SELECT agent_id, last_sync_at FROM agents WHERE agent_id = $1::text
                       FOR UPDATE) p
                 WHERE a.agent_id = p.agent_id
                 RETURNING a.boot_id, p.last_sync_at",
            )
            .await?;
        let row = tx
            .query_opt(&heard, &[&agent_id])
            .await?
            .ok_or(StoreError::UnknownAgent)?;
        let (boot_now, last_heard): (Uuid, Option<DateTime<Utc>>) = (row.get(0), row.get(1));
        if boot_now != req.boot_id {
            return Err(StoreError::StaleBoot);
        }
        // The nodes' health (a heartbeat, the signals reported, and what
        // they decide), then the workers' reports.
        let nodes =
            super::nodes::observe_sync(&tx, &self.scale, &ctx, &boot, &req.nodes, false, nodes)
                .await?;
        // Lock order, everywhere: jobs (by id), then their workers. The
        // jobs of the checkpoints reported are locked here, waiting if
        // need be (the agent sends a checkpoint once). The jobs the
        // workers' reports change are locked only if no one else holds
        // them (a plan being committed, another agent's sync for the same
        // gang): a report that would wait is left for the next sync, as
        // the agent sends every report again after a sync answered with
        // `report_again` — so a sync never queues behind the other agents' syncs for a
        // 2,048-GPU gang that ended at once (one per leaf it spans),
        // holding a connection the quiet syncs need. Taking those without
        // waiting cannot deadlock.
        let mut saved: Vec<Uuid> = req.checkpoints.iter().flatten().map(|c| c.job_id).collect();
        saved.sort();
        saved.dedup();
        lock_jobs(&tx, &saved).await?;
        let mut reported: Vec<Uuid> = (changed.iter().map(|r| r.job_id))
            .filter(|j| saved.binary_search(j).is_err())
            .collect();
        reported.sort();
        reported.dedup();
        let taken = lock_free_jobs(&tx, &reported).await?;
        let deferred = taken.len() < reported.len();
        if deferred {
            let before = changed.len();
            changed.retain(|r| saved.binary_search(&r.job_id).is_ok() || taken.contains(&r.job_id));
            metrics::counter!("gangway_sync_reports_deferred_total")
                .increment((before - changed.len()) as u64);
        }
        // Checkpoints before the workers' reports: a worker's exit that
        // requeues its job then finds the checkpoint it ended with.
        let checkpoints =
            super::checkpoints::record(&tx, agent_id, req.checkpoints.as_deref().unwrap_or(&[]))
                .await?;
        let freed_gpus = apply_reports(&tx, agent_id, &changed, uploads, last_heard).await?;
        let assignments = load_assignments(&tx, &self.scale, agent_id, timing).await?;
        tx.commit().await?;
        Ok(SyncOutcome {
            assignments,
            freed_gpus: freed_gpus || nodes.freed_gpus || nodes.fleet_changed,
            checkpoints,
            quiet: false,
            deferred,
        })
    }
}

/// Locks those of `jobs` no other transaction holds, without waiting;
/// returns them.
async fn lock_free_jobs(
    tx: &deadpool_postgres::Transaction<'_>,
    jobs: &[Uuid],
) -> Result<std::collections::BTreeSet<Uuid>> {
    if jobs.is_empty() {
        return Ok(Default::default());
    }
    let rows = tx
        .query(
            &super::cached(
                tx,
                "SELECT job_id FROM jobs WHERE job_id = ANY($1) ORDER BY job_id
                 FOR UPDATE SKIP LOCKED",
            )
            .await?,
            &[&jobs],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Agents heard by quiet syncs since the last flush. Their liveness
/// (`agents.last_sync_at`: which nodes may take work, whose claim on its
/// nodes still holds) is written for all of them in one statement, a
/// `FLUSH_AFTER` after the first one heard: one write per replica and
/// moment whatever the number of agents, instead of a commit per agent
/// and second.
#[derive(Default)]
pub(crate) struct Liveness {
    heard: std::sync::Mutex<BTreeSet<String>>,
    /// A flush is scheduled.
    flushing: std::sync::atomic::AtomicBool,
    /// Held while a flush writes: [`Store::flush_liveness`] returns only
    /// once every agent heard before it is written.
    writing: tokio::sync::Mutex<()>,
}

/// How long [`Liveness`] gathers agents before it writes them.
const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

impl Liveness {
    fn heard(&self, store: &Store, agent_id: &str) {
        use std::sync::atomic::Ordering;
        (self.heard.lock().expect("liveness lock")).insert(agent_id.to_string());
        if self.flushing.swap(true, Ordering::AcqRel) {
            return; // a flush is coming
        }
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(FLUSH_AFTER).await;
            // Agents heard from now on wait for the next flush.
            store.liveness.flushing.store(false, Ordering::Release);
            if let Err(e) = store.flush_liveness().await {
                // The agents' next quiet syncs add them again.
                tracing::warn!(error = %e, "cannot record the agents' liveness");
            }
        });
    }
}

impl Store {
    /// Writes the liveness of the agents quiet syncs heard and not yet
    /// written ([`Liveness`]); returns once they are (a flush under way
    /// included).
    pub async fn flush_liveness(&self) -> Result<()> {
        let _writing = self.liveness.writing.lock().await;
        let ids: Vec<String> =
            std::mem::take(&mut *self.liveness.heard.lock().expect("liveness lock"))
                .into_iter()
                .collect();
        if ids.is_empty() {
            return Ok(());
        }
        // A heartbeat like the peers' leases, written on their pool: it
        // never queues behind submissions or a scheduling pass, so a busy
        // region does not take its own agents for silent.
        self.lease_conn()
            .await?
            .execute(
                // An agent whose row is locked is in a sync that writes
                // it: passed over, not waited for.
                "UPDATE agents SET last_sync_at = greatest(last_sync_at, now())
                 WHERE agent_id IN (SELECT agent_id FROM agents WHERE agent_id = ANY($1)
                                    ORDER BY agent_id FOR UPDATE SKIP LOCKED)",
                &[&ids],
            )
            .await?;
        Ok(())
    }
}

/// The reports that change something, from a look at their workers
/// without locks (in the request's order). The rest — a worker running as
/// recorded, an exit already recorded, a report about an earlier placement
/// or another agent's node, a checkpoint already the job's restore point —
/// need no lock and no write. What a look classes as changing is looked at
/// again under the locks ([`apply_reports`]); one it classes as not
/// changing cannot turn into a change for the same attempt. An agent sends
/// a running worker's report until the region lists the worker started
/// ([`Assignment::started`]) and again when its checkpoint moves, an exit
/// until the worker is no longer listed: a steady agent's sync names no
/// worker and costs no read here.
async fn look_at_reports(
    tx: &deadpool_postgres::Transaction<'_>,
    agent_id: &str,
    reports: &[WorkerReport],
    uploads: bool,
) -> Result<Vec<WorkerReport>> {
    if reports.is_empty() {
        return Ok(Vec::new());
    }
    let job_ids: Vec<Uuid> = reports.iter().map(|r| r.job_id).collect();
    let ranks: Vec<i32> = reports.iter().map(|r| r.rank as i32).collect();
    // Planned at each call (a plan cached while the tables were small
    // scanned them whole once they were not; `scale.rs`), and a prepared
    // statement would be planned at each call anyway: PostgreSQL keeps
    // custom plans for `unnest` of array parameters.
    let rows = tx
        .query_typed(
            "SELECT w.job_id, w.rank, w.attempt, w.state::text, j.restore_from
             FROM unnest($1::uuid[], $2::int[]) AS r(job_id, rank)
             JOIN workers w ON w.job_id = r.job_id AND w.rank = r.rank
             JOIN nodes n ON n.node_id = w.node_id
             JOIN jobs j ON j.job_id = w.job_id
             WHERE n.agent_id = $3",
            &[
                (&job_ids, Type::UUID_ARRAY),
                (&ranks, Type::INT4_ARRAY),
                (&agent_id, Type::TEXT),
            ],
        )
        .await?;
    let current: BTreeMap<(Uuid, i32), (i32, String, Option<String>)> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3), r.get(4))))
        .collect();
    Ok(reports
        .iter()
        .filter(|report| {
            let Some((attempt, state, restore_from)) =
                current.get(&(report.job_id, report.rank as i32))
            else {
                return false;
            };
            let new_checkpoint = (report.checkpoint.as_ref())
                .filter(|c| checkpoint_counts(c, uploads))
                .is_some_and(|c| restore_from.as_ref() != Some(c));
            *attempt == report.attempt
                && (new_checkpoint || change_of(report, state) != Change::Nothing)
        })
        .cloned()
        .collect())
}

/// A checkpoint named in a worker's report counts (rather than only the
/// agent's verified uploads) when the agent uploads none, or for the
/// simulated executor's.
fn checkpoint_counts(key: &str, uploads: bool) -> bool {
    !uploads || key.starts_with("sim:")
}

/// What a worker's report changes, given its worker's recorded state (for
/// the same attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Nothing,
    /// Seen running for the first time.
    Started,
    /// Its agent lost the region for longer than its lease and stopped it.
    Fenced,
    /// Checkpointed and stopped as asked: back to pending.
    Preempted,
    /// Ended: `succeeded`, `failed`, or `cancelled` (stopped as asked).
    Ended(&'static str),
}

fn change_of(report: &WorkerReport, state: &str) -> Change {
    match &report.status {
        WorkerStatus::Running if state == "assigned" => Change::Started,
        WorkerStatus::Running => Change::Nothing,
        WorkerStatus::Exited { .. } if report.fenced && matches!(state, "assigned" | "running") => {
            Change::Fenced
        }
        // Its work was done before the request to checkpoint reached it.
        WorkerStatus::Exited {
            exit_code: Some(0), ..
        } if report.unasked && state == "checkpointing" => Change::Ended("succeeded"),
        WorkerStatus::Exited { .. } if state == "checkpointing" => Change::Preempted,
        WorkerStatus::Exited { .. } if state == "stopping" => Change::Ended("cancelled"),
        WorkerStatus::Exited { exit_code, .. } if matches!(state, "assigned" | "running") => {
            Change::Ended(if *exit_code == Some(0) {
                "succeeded"
            } else {
                "failed"
            })
        }
        WorkerStatus::Exited { .. } => Change::Nothing, // already recorded
    }
}

/// The nodes of a registration, for messages: the first few by name.
fn node_list(req: &RegisterRequest) -> String {
    let mut names: Vec<&str> = req
        .nodes
        .iter()
        .take(3)
        .map(|n| n.node_id.as_str())
        .collect();
    if req.nodes.len() > 3 {
        names.push("…");
    }
    format!("node {}", names.join(", "))
}

/// Each registered node's place in the inventory, in the request's order;
/// or the refusal (with the unknown machines recorded in `tx`).
async fn check_inventory(
    tx: &Transaction<'_>,
    req: &RegisterRequest,
) -> Result<std::result::Result<Vec<InventoryNode>, StoreError>> {
    let ids: Vec<&str> = req.nodes.iter().map(|n| n.node_id.as_str()).collect();
    let rows = tx
        .query(
            "SELECT node_id, agent_id, spine, leaf, nvlink_domain, spare, gpu_type,
                    rack_power_budget_w
             FROM inventory WHERE node_id = ANY($1)",
            &[&ids],
        )
        .await?;
    let mut known: BTreeMap<String, InventoryNode> = BTreeMap::new();
    for r in &rows {
        let node = InventoryNode {
            node_id: r.get("node_id"),
            agent_id: r.get("agent_id"),
            spine: r.get("spine"),
            leaf: r.get("leaf"),
            nvlink_domain: r.get("nvlink_domain"),
            spare: r.get("spare"),
            gpu_type: r.get("gpu_type"),
            rack_power_budget_w: r
                .get::<_, Option<i64>>("rack_power_budget_w")
                .and_then(|w| u64::try_from(w).ok()),
        };
        known.insert(node.node_id.clone(), node);
    }
    let unknown: Vec<&AgentNode> = (req.nodes.iter())
        .filter(|n| !known.contains_key(&n.node_id))
        .collect();
    if !unknown.is_empty() {
        let col =
            |f: fn(&AgentNode) -> &str| -> Vec<&str> { unknown.iter().map(|n| f(n)).collect() };
        let gpus: Vec<i32> = unknown.iter().map(|n| n.gpus.len() as i32).collect();
        tx.execute(
            "INSERT INTO unknown_nodes (node_id, agent_id, executor, gpu_type, gpus, address, reason)
             SELECT n, $2, $3, t, g, a, 'not_in_inventory'
             FROM unnest($1::text[], $4::text[], $5::int[], $6::text[]) AS x(n, t, g, a)
             ON CONFLICT (node_id) DO UPDATE
               SET agent_id = EXCLUDED.agent_id, executor = EXCLUDED.executor,
                   gpu_type = EXCLUDED.gpu_type, gpus = EXCLUDED.gpus,
                   address = EXCLUDED.address, last_seen_at = now()",
            &[
                &col(|n| &n.node_id),
                &req.agent_id,
                &req.executor,
                &col(|n| &n.gpu_type),
                &gpus,
                &col(|n| &n.address),
            ],
        )
        .await?;
        let names: Vec<&str> = unknown.iter().take(5).map(|n| n.node_id.as_str()).collect();
        return Ok(Err(StoreError::Refused {
            code: codes::UNKNOWN_NODE,
            message: format!(
                "{} of the {} node(s) registered {} not in this region's inventory ({}{}): \
                 nothing was registered. The machine is listed as unknown (gangway admin node \
                 list) until an operator admits it (gangway admin node admit NODE --spine S \
                 --leaf L) or the region's --inventory fleet file lists it",
                unknown.len(),
                req.nodes.len(),
                if unknown.len() == 1 { "is" } else { "are" },
                names.join(", "),
                if unknown.len() > names.len() {
                    ", …"
                } else {
                    ""
                },
            ),
        }));
    }
    let mut places = Vec::with_capacity(req.nodes.len());
    for n in &req.nodes {
        let Some(place) = known.remove(&n.node_id) else {
            return Ok(Err(StoreError::Refused {
                code: codes::INVALID_SPEC,
                message: format!("node {} is registered twice", n.node_id),
            }));
        };
        if place.agent() != req.agent_id {
            return Ok(Err(StoreError::Refused {
                code: codes::WRONG_AGENT,
                message: format!(
                    "node {} is served by agent {} in this region's inventory, not by {}: \
                     nothing was registered",
                    n.node_id,
                    place.agent(),
                    req.agent_id
                ),
            }));
        }
        if place.gpu_type.as_deref().is_some_and(|t| t != n.gpu_type) {
            return Ok(Err(StoreError::Invalid {
                code: codes::NODE_MISMATCH,
                message: format!(
                    "node {} has {} GPUs in this region's inventory, but its agent reports {}: \
                     nothing was registered (fix the agent's --gpu-type, or the inventory)",
                    n.node_id,
                    place.gpu_type.as_deref().unwrap_or_default(),
                    n.gpu_type
                ),
            }));
        }
        places.push(place);
    }
    Ok(Ok(places))
}

/// Applies worker reports (the caller holds their jobs' locks); returns
/// whether any GPUs were released. An
/// agent that `uploads` its checkpoints to the store reports them apart
/// (recorded before this), so its workers' `checkpoint` paths are local to
/// it and move nothing — except a simulated executor's `sim:` markers.
/// `last_heard`: the agent's previous sync (a worker it stopped on its own
/// is billed to then).
async fn apply_reports(
    tx: &Transaction<'_>,
    agent_id: &str,
    reports: &[WorkerReport],
    uploads: bool,
    last_heard: Option<DateTime<Utc>>,
) -> Result<bool> {
    if reports.is_empty() {
        return Ok(false);
    }
    let job_ids: Vec<Uuid> = reports.iter().map(|r| r.job_id).collect();
    let ranks: Vec<i32> = reports.iter().map(|r| r.rank as i32).collect();
    // Lock order, everywhere: jobs (by id), then their workers. The caller
    // (`sync_agent`) holds every reported job's lock already; cancel and
    // plan commits take the same order, so they never deadlock with a sync.
    // Current state of every reported worker that sits on this agent's nodes.
    let rows = tx
        .query_typed(
            "SELECT w.job_id, w.rank, w.attempt, w.state::text, w.node_id
             FROM unnest($1::uuid[], $2::int[]) AS r(job_id, rank)
             JOIN workers w ON w.job_id = r.job_id AND w.rank = r.rank
             JOIN nodes n ON n.node_id = w.node_id
             WHERE n.agent_id = $3
             FOR UPDATE OF w",
            &[
                (&job_ids, Type::UUID_ARRAY),
                (&ranks, Type::INT4_ARRAY),
                (&agent_id, Type::TEXT),
            ],
        )
        .await?;
    let mut current: BTreeMap<(Uuid, i32), (i32, String, String)> = BTreeMap::new();
    for row in &rows {
        current.insert(
            (row.get(0), row.get(1)),
            (row.get(2), row.get(3), row.get(4)),
        );
    }
    let mut touched = BTreeSet::new();
    let mut freed = false;
    // The common cases are written in one statement each, whatever the
    // number of workers reported (a sync costs what changed, not a round
    // trip per worker): new checkpoints, workers seen running, workers
    // that ended. The rare ones (a fenced agent's, a checkpointing
    // worker's exit, a failure's event) row by row.
    let mut checkpoints: BTreeMap<Uuid, &str> = BTreeMap::new();
    let mut started: Vec<(Uuid, i32)> = Vec::new();
    let mut ended = Ended::default();
    // Jobs whose workers its agent stopped on its own (fenced).
    let mut fenced: BTreeSet<Uuid> = BTreeSet::new();
    for report in reports {
        let key = (report.job_id, report.rank as i32);
        let Some((attempt, state, node_id)) = current.get(&key) else {
            continue;
        };
        if *attempt != report.attempt {
            continue; // about an earlier placement
        }
        if let Some(ckpt) = (report.checkpoint.as_deref()).filter(|c| checkpoint_counts(c, uploads))
        {
            // A new checkpoint (reported with an exit, or by a running
            // worker that checkpoints periodically) moves the time
            // preemption counts the work at risk from; a repeated report
            // changes nothing. The last reported for a job wins.
            checkpoints.insert(key.0, ckpt);
        }
        let WorkerStatus::Exited {
            exit_code,
            signal,
            message,
        } = &report.status
        else {
            if change_of(report, state) == Change::Started {
                started.push(key);
                touched.insert(key.0);
            }
            continue;
        };
        // A worker its agent stopped on its own ran until about the
        // agent's last sync, whatever we asked of it since.
        let until = if report.fenced { last_heard } else { None };
        match change_of(report, state) {
            Change::Nothing | Change::Started => continue,
            Change::Fenced => {
                // Its agent lost us for longer than its lease and stopped
                // it (after a checkpoint): the job moves as if the node had
                // been lost — the rest of the gang checkpoints, the job
                // requeues at the front. Once per job, however many of its
                // workers fenced.
                if fenced.insert(key.0) {
                    flush(tx, &mut checkpoints, &mut started, &mut ended).await?;
                    let by = super::jobs::PreemptBy::Node {
                        cause: "fenced",
                        node: node_id,
                        why: "its agent lost the region for longer than its lease and stopped its workers",
                    };
                    super::jobs::preempt_in_tx(tx, key.0, &by).await?;
                    metrics::counter!("gangway_preemptions_total", "cause" => "fenced")
                        .increment(1);
                }
                let why = "preempted: its agent fenced".to_string();
                ended.push(key, "preempted", None, None, why, last_heard);
            }
            Change::Preempted => {
                // Preempted, and down now: back to pending (a preemption
                // storm ends hundreds at once).
                let why = message.as_deref().unwrap_or("stopped");
                let why = format!("preempted: {why}");
                ended.push(key, "preempted", None, None, why, until);
            }
            Change::Ended(outcome) => {
                let message = message
                    .clone()
                    .unwrap_or_else(|| match (exit_code, signal) {
                        (Some(c), _) => format!("exited with code {c}"),
                        (None, Some(s)) => format!("killed by signal {s}"),
                        (None, None) => "exited".to_string(),
                    });
                if outcome == "failed" {
                    insert_event(
                        tx,
                        key.0,
                        "worker_exited",
                        &format!("worker {} failed: {message}", key.1),
                        json!({"rank": key.1, "exit_code": exit_code, "signal": signal}),
                    )
                    .await?;
                }
                ended.push(key, outcome, *exit_code, *signal, message, until);
            }
        }
        freed = true;
        touched.insert(key.0);
    }
    flush(tx, &mut checkpoints, &mut started, &mut ended).await?;
    if !fenced.is_empty() {
        let fenced: Vec<Uuid> = fenced.into_iter().collect();
        tx.execute_typed(
            "UPDATE jobs SET requeue_front = true
             WHERE job_id = ANY($1) AND state IN ('preempting', 'queued')",
            &[(&fenced, Type::UUID_ARRAY)],
        )
        .await?;
    }
    let touched: Vec<Uuid> = touched.into_iter().collect();
    super::jobs::settle_jobs(tx, &touched).await?;
    Ok(freed)
}

/// Writes what [`apply_reports`] gathered so far, a statement each: new
/// checkpoints (job → newest reported; a repeated report changes
/// nothing), workers seen running, workers that ended. Every statement of
/// a sync's writes is sent with its parameters' types (`execute_typed`):
/// one round trip each, not two (`apply.rs`, `apply_plan`, says why).
async fn flush(
    tx: &Transaction<'_>,
    checkpoints: &mut BTreeMap<Uuid, &str>,
    started: &mut Vec<(Uuid, i32)>,
    ended: &mut Ended,
) -> Result<()> {
    if !checkpoints.is_empty() {
        let (jobs, keys): (Vec<Uuid>, Vec<&str>) = std::mem::take(checkpoints).into_iter().unzip();
        tx.execute_typed(
            "UPDATE jobs j SET restore_from = x.ckpt, checkpointed_at = now()
             FROM unnest($1::uuid[], $2::text[]) AS x(job_id, ckpt)
             WHERE j.job_id = x.job_id AND j.restore_from IS DISTINCT FROM x.ckpt",
            &[(&jobs, Type::UUID_ARRAY), (&keys, Type::TEXT_ARRAY)],
        )
        .await?;
    }
    if !started.is_empty() {
        let (jobs, ranks): (Vec<Uuid>, Vec<i32>) = std::mem::take(started).into_iter().unzip();
        tx.execute_typed(
            "UPDATE workers w SET state = 'running', started_at = coalesce(w.started_at, now())
             FROM unnest($1::uuid[], $2::int[]) AS x(job_id, rank)
             WHERE w.job_id = x.job_id AND w.rank = x.rank",
            &[(&jobs, Type::UUID_ARRAY), (&ranks, Type::INT4_ARRAY)],
        )
        .await?;
    }
    std::mem::take(ended).write(tx).await
}

/// Workers that ended (succeeded, failed, cancelled as asked, or
/// `preempted`: checkpointed and stopped, back to pending), written
/// together: each ends, and its GPUs are released — as of `until` (not
/// now) when given: the last moment the worker is known to have run, for
/// one that stopped while the region could not hear of it (the usage
/// ledger bills the placement to then).
#[derive(Default)]
struct Ended {
    jobs: Vec<Uuid>,
    ranks: Vec<i32>,
    states: Vec<&'static str>,
    codes: Vec<Option<i32>>,
    signals: Vec<Option<i32>>,
    messages: Vec<String>,
    until: Vec<Option<DateTime<Utc>>>,
}

impl Ended {
    fn push(
        &mut self,
        (job, rank): (Uuid, i32),
        state: &'static str,
        code: Option<i32>,
        signal: Option<i32>,
        message: String,
        until: Option<DateTime<Utc>>,
    ) {
        self.jobs.push(job);
        self.ranks.push(rank);
        self.states.push(state);
        self.codes.push(code);
        self.signals.push(signal);
        self.messages.push(message);
        self.until.push(until);
    }

    async fn write(self, tx: &Transaction<'_>) -> Result<()> {
        if self.jobs.is_empty() {
            return Ok(());
        }
        // `preempted`: a worker that checkpointed and stopped goes back to
        // pending, off its node; the others end. Its GPUs are released in
        // the statement sent with it (the answers taken in order).
        let ending = async {
            tx.execute_typed(
                "UPDATE workers w SET
                        state = CASE WHEN x.state = 'preempted' THEN 'pending'
                                     ELSE x.state END::worker_state,
                        exit_code = CASE WHEN x.state = 'preempted' THEN w.exit_code ELSE x.code END,
                        signal = CASE WHEN x.state = 'preempted' THEN w.signal ELSE x.sig END,
                        message = x.msg,
                        finished_at = CASE WHEN x.state = 'preempted' THEN w.finished_at ELSE now() END,
                        started_at = CASE WHEN x.code IS NOT NULL THEN coalesce(w.started_at, now())
                                          ELSE w.started_at END,
                        node_id = CASE WHEN x.state = 'preempted' THEN NULL ELSE w.node_id END,
                        gpus = CASE WHEN x.state = 'preempted' THEN '{}' ELSE w.gpus END,
                        local_rank = CASE WHEN x.state = 'preempted' THEN NULL ELSE w.local_rank END
                 FROM unnest($1::uuid[], $2::int[], $3::text[], $4::int[], $5::int[], $6::text[])
                      AS x(job_id, rank, state, code, sig, msg)
                 WHERE w.job_id = x.job_id AND w.rank = x.rank",
                &[
                    (&self.jobs, Type::UUID_ARRAY),
                    (&self.ranks, Type::INT4_ARRAY),
                    (&self.states, Type::TEXT_ARRAY),
                    (&self.codes, Type::INT4_ARRAY),
                    (&self.signals, Type::INT4_ARRAY),
                    (&self.messages, Type::TEXT_ARRAY),
                ],
            )
            .await
        };
        let releasing = async {
            tx.execute_typed(
                "UPDATE allocations a
                 SET released_at = greatest(a.allocated_at, least(now(), coalesce(x.until, now()))),
                     release_reason = x.state
                 FROM unnest($1::uuid[], $2::int[], $3::text[], $4::timestamptz[])
                      AS x(job_id, rank, state, until)
                 WHERE a.job_id = x.job_id AND a.rank = x.rank AND a.released_at IS NULL",
                &[
                    (&self.jobs, Type::UUID_ARRAY),
                    (&self.ranks, Type::INT4_ARRAY),
                    (&self.states, Type::TEXT_ARRAY),
                    (&self.until, Type::TIMESTAMPTZ_ARRAY),
                ],
            )
            .await
        };
        let (ended, released) = tokio::join!(ending, releasing);
        ended?;
        released?;
        Ok(())
    }
}

/// How long workers get when they are stopped.
#[derive(Clone, Copy, Debug)]
pub struct StopTiming {
    /// Between SIGTERM and SIGKILL.
    pub grace_period_s: u64,
    /// To write a checkpoint when asked to.
    pub checkpoint_deadline_s: u64,
}

async fn load_assignments(
    tx: &deadpool_postgres::Transaction<'_>,
    scale: &TableScale,
    agent_id: &str,
    timing: StopTiming,
) -> Result<Vec<Assignment>> {
    // Prepared per connection and table scale (`scale.rs`): planned again
    // only when `workers`, `jobs`, `nodes` or `agents` passed a power of two
    // of their pages. (Prepared once and kept, a plan made while the tables were
    // small — a fresh region's first seconds — scanned `jobs` and `workers`
    // whole once they were not: 24 ms a sync at 3,500 jobs. Planned at
    // every call, about a millisecond of planning for 0.04 ms of execution
    // at a quiet sync.)
    let read = scale
        .prepare(
            tx,
            "SELECT w.job_id, w.rank, w.attempt, w.state::text AS state, w.node_id, w.gpus,
                    w.local_rank, coalesce(j.run_workers, j.workers) AS world_size,
                    j.mode::text AS mode, j.spec, j.restore_from, j.epoch, j.tenant,
                    n.address, m.address AS master_addr,
                    CASE WHEN n.operator_state = 'draining' AND NOT n.drain_wait
                         THEN greatest(1, ceil(extract(epoch FROM n.drain_deadline - now())))::bigint
                    END AS drain_left_s
             FROM workers w
             JOIN nodes n ON n.node_id = w.node_id
             JOIN jobs j ON j.job_id = w.job_id
             LEFT JOIN workers w0 ON w0.job_id = w.job_id AND w0.rank = 0
             LEFT JOIN nodes m ON m.node_id = w0.node_id
             WHERE n.agent_id = $1::text
               AND w.state IN ('assigned', 'running', 'checkpointing', 'stopping')
             ORDER BY w.job_id, w.rank",
        )
        .await?;
    let rows = tx.query(&read, &[&agent_id]).await?;
    let mut specs: BTreeMap<Uuid, Option<JobSpec>> = BTreeMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let job_id: Uuid = row.get("job_id");
        let spec = specs
            .entry(job_id)
            .or_insert_with(|| serde_json::from_value(row.get("spec")).ok());
        let Some(spec) = spec else { continue };
        let state: String = row.get("state");
        let mode: String = row.get("mode");
        let gpus: Vec<i32> = row.get("gpus");
        let rank: i32 = row.get("rank");
        let own_addr: String = row.get("address");
        let gang = mode == "gang";
        out.push(Assignment {
            job_id,
            tenant: row.get("tenant"),
            rank: rank as u32,
            attempt: row.get("attempt"),
            desired: match state.as_str() {
                "stopping" => Desired::Stop,
                "checkpointing" => Desired::Checkpoint,
                _ => Desired::Run,
            },
            node_id: row.get("node_id"),
            gpus: gpus.into_iter().map(|g| g as u32).collect(),
            // The workers of this run (an elastic gang may run with fewer
            // than all of its ranks).
            world_size: row.get::<_, i32>("world_size") as u32,
            local_rank: row.get::<_, Option<i32>>("local_rank").unwrap_or(0) as u32,
            master_addr: if gang {
                row.get::<_, Option<String>>("master_addr")
                    .unwrap_or(own_addr)
            } else {
                own_addr
            },
            master_port: master_port(job_id),
            command: spec.command.clone(),
            env: spec.env.clone(),
            estimated_duration_s: spec.estimated_duration_s,
            max_duration_s: spec.max_duration_s,
            grace_period_s: timing.grace_period_s,
            // A node being drained in checkpoint mode: no later than the
            // drain's deadline.
            checkpoint_deadline_s: row
                .get::<_, Option<i64>>("drain_left_s")
                .map_or(timing.checkpoint_deadline_s, |left| {
                    timing.checkpoint_deadline_s.min(left.max(1) as u64)
                }),
            restore_from: row.get("restore_from"),
            epoch: row.get("epoch"),
            started: state != "assigned",
        });
    }
    Ok(out)
}
