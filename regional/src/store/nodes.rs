//! Nodes: health fed from agents' syncs and the clock, operators' actions
//! and injected faults, and what the two axes decide together.
//!
//! What operators asked ([`Admin`], the `operator_state` columns) and what
//! the node's signals add up to ([`NodeHealth`], `nodes.health`) meet in
//! one place, [`gangway_health::decide`]; [`reconcile_node`] then carries
//! the decision out, idempotently: it is run after every change to either
//! axis and on every health tick, so a step that did not happen (a lost
//! race, a restart) happens on the next one.
//!
//! - `evacuate` (a drain, a node fault, repair): the node's running jobs go
//!   through the preemption path (checkpoint, stop, requeue) with a cause
//!   (`drain`, `maintenance`, `repair`, `health`);
//! - `evacuate_gpus` (a quarantined GPU): only the jobs on those GPUs;
//! - `lost` (silent too long, or dead): the node's workers are gone with
//!   it; their jobs requeue from their newest checkpoints.
//!
//! Jobs moved for the node's sake go to the front of their queue
//! (`jobs.requeue_front`) until they are placed again.
//!
//! Lock order, as everywhere: agent → nodes (by id) → `sched_state` → jobs
//! (by id) → workers.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_health::{decide, Admin, Decision, Effect, HealthPolicy, NodeHealth, Observed, Signal};
use gangway_shared::agent::NodeReport;
use gangway_shared::api::{DrainMode, Fault, NodeEvent, NodeView};
use serde_json::json;
use tokio_postgres::types::Type;
use tokio_postgres::{Row, Transaction};
use uuid::Uuid;

use super::jobs::{lock_jobs, preempt_in_tx, settle_job, PreemptBy};
use super::{Result, Store};

/// What the health code needs besides the rows.
#[derive(Clone, Debug)]
pub struct HealthContext {
    pub policy: HealthPolicy,
    /// Seconds a worker asked to checkpoint has (the region's deadline): a
    /// `wait` drain past its deadline gives its jobs this long.
    pub checkpoint_deadline_s: u64,
}

/// What a sync's or a tick's node work did.
#[derive(Clone, Debug, Default)]
pub struct NodesOutcome {
    /// What may be scheduled changed (the generation moved).
    pub fleet_changed: bool,
    /// GPUs were released (a lost node's workers).
    pub freed_gpus: bool,
    /// Jobs asked to checkpoint and move.
    pub evacuated: Vec<Uuid>,
    /// Jobs whose workers were lost with a node.
    pub lost: Vec<Uuid>,
}

impl NodesOutcome {
    /// The jobs it moved off their nodes: evacuated or lost with one.
    pub fn moved(&self) -> Vec<Uuid> {
        self.evacuated.iter().chain(&self.lost).copied().collect()
    }

    pub(super) fn absorb(&mut self, o: NodesOutcome) {
        self.fleet_changed |= o.fleet_changed;
        self.freed_gpus |= o.freed_gpus;
        self.evacuated.extend(o.evacuated);
        self.lost.extend(o.lost);
    }
}

/// Why a node action was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRefusal {
    NotFound,
    /// The operator state does not allow it (a maintenance plan holds it…).
    Conflict(String),
    /// Faults are injected only into simulated nodes.
    NotSimulated,
    /// The fault does not fit the node (a GPU it does not have…).
    InvalidFault(String),
}

/// Columns [`NodeRow::from_row`] reads (`n` = nodes, `a` = agents).
pub(super) const NODE_COLUMNS: &str = "n.node_id, n.agent_id, a.executor, n.spine, n.leaf, \
    n.nvlink_domain, n.gpu_type, n.spare, n.operator_state, n.admin_reason, n.drain_wait, \
    extract(epoch FROM n.drain_deadline)::bigint AS drain_deadline_s, n.health, n.observed, \
    n.usable, n.boot_id, n.last_heartbeat_at, n.sim_down, extract(epoch FROM n.silent_until)::bigint AS silent_until_s, \
    n.sim_reboots, n.gpu_power_w, n.rack_power_budget_w, n.rack_throttled, \
    (SELECT count(*) FROM gpus g WHERE g.node_id = n.node_id)::int AS gpu_count";

/// One node as the health code works on it.
#[derive(Clone, Debug)]
pub(super) struct NodeRow {
    pub node_id: String,
    pub agent_id: String,
    pub executor: String,
    pub gpus: u32,
    pub admin: Admin,
    pub admin_reason: Option<String>,
    pub health: NodeHealth,
    /// As stored: to tell what changed.
    stored_health: Option<serde_json::Value>,
    pub observed: String,
    pub usable: Vec<i32>,
    pub boot_id: Option<String>,
    pub sim_down: bool,
    pub silent_until_s: Option<i64>,
    pub sim_reboots: i32,
    /// Silence past the lost limit is held at suspect (a mass silence, or
    /// a loss waiting its turn: `Store::health_tick`).
    pub hold_silence: bool,
}

impl NodeRow {
    pub fn from_row(row: &Row) -> NodeRow {
        let gpus = row.get::<_, i32>("gpu_count").max(0) as u32;
        let stored: Option<serde_json::Value> = row.get("health");
        let health = stored
            .clone()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_else(|| NodeHealth::new(gpus));
        NodeRow {
            node_id: row.get("node_id"),
            agent_id: row.get("agent_id"),
            executor: row.get("executor"),
            gpus,
            admin: admin_from_row(row),
            admin_reason: row.get("admin_reason"),
            health,
            stored_health: stored,
            observed: row.get("observed"),
            usable: row.get("usable"),
            boot_id: row.get("boot_id"),
            sim_down: row.get("sim_down"),
            silent_until_s: row.get("silent_until_s"),
            sim_reboots: row.get("sim_reboots"),
            hold_silence: false,
        }
    }

    /// What the node's signals add up to at `now`, silence held at suspect
    /// if [`NodeRow::hold_silence`].
    fn observed(&self, policy: &HealthPolicy, now: u64) -> Observed {
        if self.hold_silence {
            self.health.observed_holding_silence(policy, now)
        } else {
            self.health.observed(policy, now)
        }
    }
}

/// The operator's intent from a row's `operator_state`, `admin_reason`,
/// `drain_wait` and `drain_deadline_s` columns.
pub(super) fn admin_from_row(row: &Row) -> Admin {
    let state: String = row.get("operator_state");
    let reason = row
        .get::<_, Option<String>>("admin_reason")
        .unwrap_or_default();
    match state.as_str() {
        "cordoned" => Admin::Cordoned { reason },
        "draining" => Admin::Draining {
            wait: row.get::<_, Option<bool>>("drain_wait").unwrap_or(false),
            deadline: row
                .get::<_, Option<i64>>("drain_deadline_s")
                .unwrap_or(0)
                .max(0) as u64,
        },
        "maintenance" => Admin::Maintenance { plan: reason },
        "repair" => Admin::Repair { reason },
        _ => Admin::Active,
    }
}

/// Records the node's latest word on its rack's thermal state. A change
/// moves the generation (every node of the leaf turns unschedulable, or
/// may schedule again: a plan computed before is stale) and is a node
/// event; returns whether it changed. Running work stays either way. The
/// caller holds the node's row lock.
pub(super) async fn set_rack_thermal(
    tx: &Transaction<'_>,
    node_id: &str,
    throttled: bool,
) -> Result<bool> {
    let Some(row) = tx
        .query_opt(
            "UPDATE nodes SET rack_throttled = $2 WHERE node_id = $1 AND rack_throttled <> $2
             RETURNING leaf",
            &[&node_id, &throttled],
        )
        .await?
    else {
        return Ok(false);
    };
    let leaf: String = row.get(0);
    tx.execute(
        "UPDATE sched_state SET generation = generation + 1 WHERE id = 1",
        &[],
    )
    .await?;
    let message = if throttled {
        format!(
            "rack {leaf} reports thermal throttling: no node of the rack takes new work until it \
             recovers; running jobs stay"
        )
    } else {
        format!("rack {leaf} no longer reports thermal throttling (by this node)")
    };
    node_event(
        tx,
        node_id,
        "health",
        &message,
        json!({"code": "rack_thermal", "leaf": leaf, "throttled": throttled}),
    )
    .await?;
    Ok(true)
}

/// Why a node of a thermally throttling rack takes no new work.
pub(super) fn rack_throttled_why(leaf: &str) -> String {
    format!("rack {leaf} is thermally throttling: no new work in the rack until it recovers")
}

/// What both axes decide for a node row of the snapshot at `now`: the
/// scheduler's one source of schedulable nodes and usable GPUs. Reads the
/// admin columns (as [`admin_from_row`]) and `health`; `gpus`: how many
/// GPUs the node has.
pub(super) fn decision_of(row: &Row, gpus: u32, policy: &HealthPolicy, now: u64) -> Decision {
    let health: NodeHealth = row
        .get::<_, Option<serde_json::Value>>("health")
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_else(|| NodeHealth::new(gpus));
    decide(&admin_from_row(row), &health.observed(policy, now), gpus)
}

/// A queued unit's `seq` for the scheduler core: jobs moved off a node for
/// the node's sake keep their submission order among themselves but come
/// before every other job of their priority.
pub(super) fn queue_seq(seq: i64, front: bool) -> u64 {
    const BACK: u64 = 1 << 40;
    let seq = seq.max(0) as u64;
    if front {
        seq
    } else {
        seq + BACK
    }
}

/// What a preemption for the node's sake is called in job events.
fn evacuation_cause(admin: &Admin) -> &'static str {
    match admin {
        Admin::Draining { .. } | Admin::Cordoned { .. } => "drain",
        Admin::Maintenance { .. } => "maintenance",
        Admin::Repair { .. } => "repair",
        Admin::Active => "health",
    }
}

pub(super) async fn db_now(tx: &Transaction<'_>) -> Result<u64> {
    let row = tx
        .query_one("SELECT floor(extract(epoch FROM now()))::bigint", &[])
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

fn at(t: u64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.min(i64::MAX as u64) as i64, 0)
}

pub(super) async fn node_event(
    tx: &Transaction<'_>,
    node_id: &str,
    kind: &str,
    message: &str,
    detail: serde_json::Value,
) -> Result<()> {
    tx.execute(
        "INSERT INTO node_events (node_id, kind, message, detail) VALUES ($1, $2, $3, $4)",
        &[&node_id, &kind, &message, &detail],
    )
    .await?;
    Ok(())
}

/// Writes the node's health, observed state and usable GPUs when they
/// changed, records its effects and state changes as node events, and
/// carries out what both axes decide (evacuate, evacuate GPUs, lost).
/// Idempotent. The caller holds the node's row lock.
pub(super) async fn reconcile_node(
    tx: &Transaction<'_>,
    ctx: &HealthContext,
    now: u64,
    node: &mut NodeRow,
    effects: &[Effect],
) -> Result<NodesOutcome> {
    let mut writes = NodeWrites::default();
    let out = reconcile_into(tx, ctx, now, node, effects, &mut writes).await?;
    writes.flush(tx).await?;
    Ok(out)
}

/// Node writes gathered from several reconciles, made together in a few
/// statements ([`NodeWrites::flush`]): a sync that hears from hundreds of
/// nodes at once (after a mass silence) costs a handful of round trips,
/// not several per node.
#[derive(Default)]
pub(super) struct NodeWrites {
    event_nodes: Vec<String>,
    event_kinds: Vec<&'static str>,
    event_messages: Vec<String>,
    event_details: Vec<serde_json::Value>,
    nodes: Vec<String>,
    health: Vec<serde_json::Value>,
    observed: Vec<&'static str>,
    /// Usable GPUs as array literals (`{0,1}`): arrays of arrays do not
    /// unnest row by row.
    usable: Vec<String>,
    /// What may be scheduled changed: the generation moves (once).
    bump: bool,
}

impl NodeWrites {
    fn event(
        &mut self,
        node: &str,
        kind: &'static str,
        message: String,
        detail: serde_json::Value,
    ) {
        self.event_nodes.push(node.to_string());
        self.event_kinds.push(kind);
        self.event_messages.push(message);
        self.event_details.push(detail);
    }

    /// Makes the gathered writes.
    pub(super) async fn flush(&mut self, tx: &Transaction<'_>) -> Result<()> {
        let w = std::mem::take(self);
        if !w.event_nodes.is_empty() {
            tx.execute(
                "INSERT INTO node_events (node_id, kind, message, detail)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[])",
                &[
                    &w.event_nodes,
                    &w.event_kinds,
                    &w.event_messages,
                    &w.event_details,
                ],
            )
            .await?;
        }
        if !w.nodes.is_empty() {
            tx.execute(
                "UPDATE nodes n SET health = x.health, observed = x.observed, usable = x.usable::int[]
                 FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::text[])
                      AS x(node_id, health, observed, usable)
                 WHERE n.node_id = x.node_id",
                &[&w.nodes, &w.health, &w.observed, &w.usable],
            )
            .await?;
        }
        if w.bump {
            // What may be scheduled changed: a plan computed before is stale.
            tx.execute(
                "UPDATE sched_state SET generation = generation + 1 WHERE id = 1",
                &[],
            )
            .await?;
        }
        Ok(())
    }
}

/// [`reconcile_node`], its plain writes gathered into `writes` (made
/// before any action: evacuating or losing jobs, a spare swap).
pub(super) async fn reconcile_into(
    tx: &Transaction<'_>,
    ctx: &HealthContext,
    now: u64,
    node: &mut NodeRow,
    effects: &[Effect],
    writes: &mut NodeWrites,
) -> Result<NodesOutcome> {
    let mut out = NodesOutcome::default();
    // A `wait` drain past its deadline: what is left is checkpointed and
    // moved now.
    if let Admin::Draining {
        wait: true,
        deadline,
    } = node.admin
    {
        if deadline <= now {
            let deadline = now + ctx.checkpoint_deadline_s.max(1);
            node.admin = Admin::Draining {
                wait: false,
                deadline,
            };
            tx.execute(
                "UPDATE nodes SET drain_wait = false, drain_deadline = to_timestamp($2)
                 WHERE node_id = $1",
                &[&node.node_id, &(deadline as f64)],
            )
            .await?;
            node_event(
                tx,
                &node.node_id,
                "admin",
                "drain deadline passed: the jobs still running are checkpointed and moved",
                json!({"mode": "checkpoint", "deadline": at(deadline)}),
            )
            .await?;
        }
    }

    let observed = node.observed(&ctx.policy, now);
    let decision = decide(&node.admin, &observed, node.gpus);
    let usable: Vec<i32> = decision.usable.iter().map(|&g| g as i32).collect();
    let health_json = serde_json::to_value(&node.health).expect("NodeHealth serializes");
    let code = observed.code();
    let state_changed = code != node.observed;
    if state_changed {
        // Counted as decided (a transaction retried after a race may count
        // one twice): a rate per node set, for "nodes flapping" alerts.
        metrics::counter!("gangway_node_state_changes_total", "to" => code.to_string())
            .increment(1);
        writes.event(
            &node.node_id,
            "state",
            format!(
                "{} → {code}{}",
                node.observed,
                decision
                    .why
                    .as_ref()
                    .map(|w| format!(": {w}"))
                    .unwrap_or_default()
            ),
            json!({"from": node.observed, "to": code, "observed": observed,
                   "schedulable": decision.schedulable, "usable": decision.usable}),
        );
    }
    for e in effects {
        metrics::counter!("gangway_health_effects_total", "action" => e.action.as_str())
            .increment(1);
        writes.event(
            &node.node_id,
            "health",
            e.message.clone(),
            json!({"action": e.action, "gpu": e.gpu, "code": e.code}),
        );
    }
    if state_changed || usable != node.usable || node.stored_health.as_ref() != Some(&health_json) {
        writes.nodes.push(node.node_id.clone());
        writes.health.push(health_json.clone());
        writes.observed.push(code);
        writes.usable.push(format!(
            "{{{}}}",
            usable
                .iter()
                .map(i32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    if usable != node.usable {
        writes.bump = true;
        out.fleet_changed = true;
    }
    node.observed = code.to_string();
    node.usable = usable;
    node.stored_health = Some(health_json);

    let why = decision.why.clone().unwrap_or_else(|| match &observed {
        Observed::Degraded { quarantined, .. } => format!("GPUs {quarantined:?} quarantined"),
        _ => code.to_string(),
    });
    // A dedicated cluster's member that fails is replaced from the
    // cluster's domain (`clusters/tend.rs`).
    if decision.lost || decision.evacuate || !decision.evacuate_gpus.is_empty() {
        // Actions read the nodes (a spare's health…): the writes first.
        writes.flush(tx).await?;
    }
    let member = if decision.lost || decision.evacuate {
        super::clusters::membership(tx, &node.node_id).await?
    } else {
        None
    };
    let within = member.as_ref().map_or(&[][..], |m| m.path.as_slice());
    if decision.lost {
        // Running gangs here get a spare in the node's place.
        let gangs = super::spares::gangs_on(tx, &node.node_id).await?;
        let lost = lose_jobs(tx, &node.node_id, &why).await?;
        let mut swapped = None;
        if !gangs.is_empty() {
            swapped = super::spares::swap_in(tx, &node.node_id, &why, &gangs, within).await?;
            out.fleet_changed = true;
        }
        if let Some(m) = &member {
            super::clusters::member_failed(tx, m, &node.node_id, &why, swapped).await?;
            out.fleet_changed = true;
        }
        if !lost.is_empty() {
            out.freed_gpus = true;
            metrics::counter!("gangway_preemptions_total", "cause" => "node_lost")
                .increment(lost.len() as u64);
            node_event(
                tx,
                &node.node_id,
                "lost",
                &format!(
                    "{} job(s) lost workers with the node; they requeue at the front from their \
                     newest checkpoints",
                    lost.len()
                ),
                json!({"jobs": lost}),
            )
            .await?;
            out.lost = lost;
        }
    } else if decision.evacuate || !decision.evacuate_gpus.is_empty() {
        let (cause, gpus) = if decision.evacuate {
            let cause = match (&node.admin, &observed) {
                (
                    Admin::Active | Admin::Cordoned { .. },
                    Observed::Failed { .. } | Observed::NeedsRepair { .. },
                ) => "health",
                (admin, _) => evacuation_cause(admin),
            };
            (cause, None)
        } else {
            ("health", Some(decision.evacuate_gpus.clone()))
        };
        // A failed node (not a drain, not one quarantined GPU): running
        // gangs here get a spare in its place.
        let gangs = if cause == "health" && gpus.is_none() {
            super::spares::gangs_on(tx, &node.node_id).await?
        } else {
            Vec::new()
        };
        let moved = evacuate(tx, &node.node_id, gpus.as_deref(), cause, &why).await?;
        let mut swapped = None;
        if !gangs.is_empty() {
            swapped = super::spares::swap_in(tx, &node.node_id, &why, &gangs, within).await?;
            out.fleet_changed = true;
        }
        if let (Some(m), "health", None) = (&member, cause, &gpus) {
            super::clusters::member_failed(tx, m, &node.node_id, &why, swapped).await?;
            out.fleet_changed = true;
        }
        if !moved.is_empty() {
            metrics::counter!("gangway_preemptions_total", "cause" => cause)
                .increment(moved.len() as u64);
            node_event(
                tx,
                &node.node_id,
                "evacuate",
                &format!(
                    "{} job(s) asked to checkpoint and move ({cause}: {why}){}",
                    moved.len(),
                    gpus.as_ref()
                        .map(|g| format!(" off GPUs {g:?}"))
                        .unwrap_or_default()
                ),
                json!({"jobs": moved, "cause": cause, "gpus": gpus}),
            )
            .await?;
            out.evacuated = moved;
        }
    }
    Ok(out)
}

/// Asks the running jobs on the node (or on `gpus` of it) to checkpoint,
/// stop and requeue at the front; returns those asked now.
pub(super) async fn evacuate(
    tx: &Transaction<'_>,
    node_id: &str,
    gpus: Option<&[u32]>,
    cause: &str,
    why: &str,
) -> Result<Vec<Uuid>> {
    let gpus: Option<Vec<i32>> = gpus.map(|g| g.iter().map(|&x| x as i32).collect());
    let rows = tx
        .query(
            "SELECT DISTINCT a.job_id FROM allocations a JOIN jobs j ON j.job_id = a.job_id
             WHERE a.node_id = $1 AND a.released_at IS NULL
               AND ($2::int[] IS NULL OR a.gpu_index = ANY($2))
               AND j.state IN ('starting', 'running')
             ORDER BY a.job_id",
            &[&node_id, &gpus],
        )
        .await?;
    let jobs: Vec<Uuid> = rows.iter().map(|r| r.get(0)).collect();
    if jobs.is_empty() {
        return Ok(jobs);
    }
    lock_jobs(tx, &jobs).await?;
    let mut moved = Vec::new();
    for job in jobs {
        let by = PreemptBy::Node {
            cause,
            node: node_id,
            why,
        };
        if preempt_in_tx(tx, job, &by).await? {
            tx.execute(
                "UPDATE jobs SET requeue_front = true WHERE job_id = $1",
                &[&job],
            )
            .await?;
            moved.push(job);
        }
    }
    Ok(moved)
}

/// The node is gone, and its workers with it: they go back to pending (or,
/// being stopped, count as stopped) and their GPUs are released; the rest
/// of each gang is asked to checkpoint and stop; the jobs requeue at the
/// front. Returns the jobs concerned.
async fn lose_jobs(tx: &Transaction<'_>, node_id: &str, why: &str) -> Result<Vec<Uuid>> {
    lose_jobs_at(tx, node_id, why, None).await
}

/// [`lose_jobs`], the workers gone as of `ended` (not now) when given: the
/// last moment they are known to have run (their GPU time ends then).
pub(super) async fn lose_jobs_at(
    tx: &Transaction<'_>,
    node_id: &str,
    why: &str,
    ended: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Vec<Uuid>> {
    let rows = tx
        .query(
            "SELECT DISTINCT job_id FROM workers
             WHERE node_id = $1 AND state IN ('assigned', 'running', 'checkpointing', 'stopping')
             ORDER BY job_id",
            &[&node_id],
        )
        .await?;
    let jobs: Vec<Uuid> = rows.iter().map(|r| r.get(0)).collect();
    if jobs.is_empty() {
        return Ok(jobs);
    }
    lock_jobs(tx, &jobs).await?;
    let message = format!("lost with node {node_id} ({why})");
    for &job in &jobs {
        // Goodput: the lost workers' work since the last checkpoint is gone.
        tx.execute(
            "UPDATE jobs j SET lost_gpu_s = lost_gpu_s + coalesce((
                 SELECT sum(greatest(0, extract(epoch FROM least(now(), coalesce($3, now()))
                            - greatest(a.allocated_at, coalesce(j.checkpointed_at, a.allocated_at)))))
                 FROM allocations a
                 WHERE a.job_id = j.job_id AND a.node_id = $2 AND a.released_at IS NULL), 0)::float8
             WHERE j.job_id = $1",
            &[&job, &node_id, &ended],
        )
        .await?;
        let by = PreemptBy::Node {
            cause: "node_lost",
            node: node_id,
            why,
        };
        preempt_in_tx(tx, job, &by).await?;
        // Workers on the lost node: gone, whatever they were doing.
        tx.execute(
            "UPDATE workers SET state = 'pending', node_id = NULL, gpus = '{}', local_rank = NULL,
                    message = $3
             WHERE job_id = $1 AND node_id = $2
               AND state IN ('assigned', 'running', 'checkpointing')",
            &[&job, &node_id, &message],
        )
        .await?;
        tx.execute(
            "UPDATE workers SET state = 'cancelled', finished_at = now(), message = $3
             WHERE job_id = $1 AND node_id = $2 AND state = 'stopping'",
            &[&job, &node_id, &message],
        )
        .await?;
        tx.execute(
            "UPDATE allocations
             SET released_at = greatest(allocated_at, least(now(), coalesce($3, now()))),
                 release_reason = 'node_lost'
             WHERE job_id = $1 AND node_id = $2 AND released_at IS NULL",
            &[&job, &node_id, &ended],
        )
        .await?;
        tx.execute(
            "UPDATE jobs SET requeue_front = true
             WHERE job_id = $1 AND state IN ('preempting', 'queued')",
            &[&job],
        )
        .await?;
        settle_job(tx, job).await?;
    }
    Ok(jobs)
}

/// The node's boot id as the health code sees it: the machine's, marked
/// with each simulated reboot.
pub(super) fn effective_boot(reported: &str, sim_reboots: i32) -> String {
    if sim_reboots > 0 {
        format!("{reported}+sim-reboot-{sim_reboots}")
    } else {
        reported.to_string()
    }
}

/// A first look at an agent's nodes for a sync, without locks: which have
/// something to record ([`NodesLook::due`]: a heartbeat older than a third
/// of the suspect limit, a new boot id, signals; every node with
/// `keep_boot`), so that a large fleet's every-second sync writes little
/// and a quiet one writes nothing.
///
/// `named`: the nodes the request names (reports, checkpoints). One the
/// agent does not serve refuses the whole sync (`wrong_agent`) before
/// anything is written.
pub(super) async fn look_at_nodes(
    tx: &deadpool_postgres::Transaction<'_>,
    ctx: &HealthContext,
    agent_id: &str,
    default_boot: &str,
    reports: &[NodeReport],
    named: &[&str],
    keep_boot: bool,
) -> Result<NodesLook> {
    let by_node: BTreeMap<&str, &NodeReport> =
        reports.iter().map(|r| (r.node_id.as_str(), r)).collect();
    // Often enough that the recorded heartbeat is never taken for silence.
    let refresh = heartbeat_refresh_s(&ctx.policy) as i64;
    let light = tx
        .query(
            &super::cached(
                tx,
                "SELECT node_id, boot_id, sim_reboots, sim_down,
                        extract(epoch FROM silent_until)::bigint AS silent_until_s,
                        extract(epoch FROM last_heartbeat_at)::bigint AS last_heartbeat_s,
                        health->>'boot_id' AS health_boot,
                        floor(extract(epoch FROM now()))::bigint AS now_s
                 FROM nodes WHERE agent_id = $1",
            )
            .await?,
            &[&agent_id],
        )
        .await?;
    let served: std::collections::BTreeSet<&str> =
        light.iter().map(|r| r.get::<_, &str>("node_id")).collect();
    if let Some(other) = named.iter().find(|n| !served.contains(**n)) {
        return Err(super::StoreError::Refused {
            code: gangway_shared::error::codes::WRONG_AGENT,
            message: format!(
                "agent {agent_id} does not serve node {other}: nothing of this sync was recorded"
            ),
        });
    }
    let mut look = NodesLook {
        now: light
            .first()
            .map(|r| r.get::<_, i64>("now_s").max(0) as u64),
        due: Vec::new(),
    };
    let Some(now) = look.now else {
        return Ok(look);
    };
    for row in &light {
        let node_id: String = row.get("node_id");
        let quiet = row.get::<_, bool>("sim_down")
            || row
                .get::<_, Option<i64>>("silent_until_s")
                .is_some_and(|t| t > now as i64);
        let Some((_, boot)) = heard_boot(
            &by_node,
            default_boot,
            keep_boot,
            &node_id,
            row.get::<_, Option<String>>("boot_id").as_deref(),
            row.get("sim_reboots"),
            quiet,
        ) else {
            continue;
        };
        let stale = row
            .get::<_, Option<i64>>("last_heartbeat_s")
            .is_none_or(|t| now as i64 - t >= refresh);
        let new_boot = row.get::<_, Option<String>>("health_boot").as_deref() != Some(&boot);
        let signals = by_node
            .get(node_id.as_str())
            .is_some_and(|r| !r.signals.is_empty());
        if stale || new_boot || signals || keep_boot {
            look.due.push(node_id);
        }
    }
    look.due.sort();
    Ok(look)
}

/// What [`look_at_nodes`] found.
#[derive(Debug, Default)]
pub(super) struct NodesLook {
    /// The database's clock (whole seconds); `None` if the agent serves no
    /// node.
    now: Option<u64>,
    /// The nodes with something to record, by id.
    pub due: Vec<String>,
}

/// How often a node's (and its agent's) heartbeat is written at most: a
/// third of the suspect limit, so that the recorded one is never taken for
/// silence.
pub(super) fn heartbeat_refresh_s(policy: &HealthPolicy) -> u64 {
    (policy.suspect_after_s / 3).max(1)
}

/// What a node's heartbeat would be now, heard through its agent's sync:
/// (reported boot, effective boot), or `None` for a node that says nothing
/// (simulated dead or silent). A node the sync does not report is heard
/// from on `default_boot`, or, with `keep_boot` (registration), on the boot
/// it last reported.
fn heard_boot(
    by_node: &BTreeMap<&str, &NodeReport>,
    default_boot: &str,
    keep_boot: bool,
    node_id: &str,
    stored: Option<&str>,
    sim_reboots: i32,
    quiet: bool,
) -> Option<(String, String)> {
    if quiet {
        return None;
    }
    let unreported = stored.filter(|_| keep_boot).unwrap_or(default_boot);
    let reported = by_node
        .get(node_id)
        .map_or(unreported, |r| r.boot_id.as_str())
        .to_string();
    let effective = effective_boot(&reported, sim_reboots);
    Some((reported, effective))
}

/// Feeds one agent's sync into its nodes' health, for the nodes
/// [`look_at_nodes`] found due: a heartbeat and the signals reported, then
/// reconciles each. The caller holds the agent's row lock.
///
/// What it costs is what changed: only the due nodes are locked, and their
/// heartbeats and what those change are written in a few statements
/// whatever their number ([`NodeWrites`]); only actions (evacuating,
/// losing jobs) go node by node.
pub(super) async fn observe_sync(
    tx: &deadpool_postgres::Transaction<'_>,
    scale: &super::scale::TableScale,
    ctx: &HealthContext,
    default_boot: &str,
    reports: &[NodeReport],
    keep_boot: bool,
    look: NodesLook,
) -> Result<NodesOutcome> {
    let by_node: BTreeMap<&str, &NodeReport> =
        reports.iter().map(|r| (r.node_id.as_str(), r)).collect();
    let (Some(now), due) = (look.now, look.due) else {
        return Ok(NodesOutcome::default());
    };
    if due.is_empty() {
        return Ok(NodesOutcome::default());
    }
    let lock = scale
        .prepare(
            tx,
            &format!(
                "SELECT {NODE_COLUMNS} FROM nodes n JOIN agents a ON a.agent_id = n.agent_id
                 WHERE n.node_id = ANY($1::text[]) ORDER BY n.node_id FOR UPDATE OF n"
            ),
        )
        .await?;
    let rows = tx.query(&lock, &[&due]).await?;
    let mut out = NodesOutcome::default();
    // Every node heard: its heartbeat (id, reported boot), in one statement;
    // what it changes, gathered into `writes`.
    let (mut heard_ids, mut heard_boots) = (vec![], vec![]);
    let mut writes = NodeWrites::default();
    for row in &rows {
        let mut node = NodeRow::from_row(row);
        let quiet = node.sim_down || node.silent_until_s.is_some_and(|t| t > now as i64);
        let Some((reported_boot, boot)) = heard_boot(
            &by_node,
            default_boot,
            keep_boot,
            &node.node_id,
            node.boot_id.as_deref(),
            node.sim_reboots,
            quiet,
        ) else {
            continue; // a simulated dead node or dropped link says nothing
        };
        let signals: &[Signal] = by_node
            .get(node.node_id.as_str())
            .map_or(&[], |r| r.signals.as_slice());
        let mut effects = node.health.observe(
            &ctx.policy,
            now,
            &Signal::Heartbeat {
                boot_id: boot.clone(),
            },
        );
        let mut rack_thermal = None;
        for s in signals {
            match s {
                Signal::Heartbeat { .. } => continue, // heartbeats are the sync itself
                // The rack's, not the node's: the latest report wins.
                Signal::RackThermal { throttled } => rack_thermal = Some(*throttled),
                _ => effects.extend(node.health.observe(&ctx.policy, now, s)),
            }
        }
        if let Some(throttled) = rack_thermal {
            out.fleet_changed |= set_rack_thermal(tx, &node.node_id, throttled).await?;
        }
        heard_ids.push(node.node_id.clone());
        heard_boots.push(reported_boot);
        out.absorb(reconcile_into(tx, ctx, now, &mut node, &effects, &mut writes).await?);
    }
    if !heard_ids.is_empty() {
        // With its parameters' types: one round trip, not two.
        let at = now as f64;
        tx.execute_typed(
            "UPDATE nodes n SET boot_id = x.boot, last_heartbeat_at = to_timestamp($3),
                    silent_until = NULL
             FROM unnest($1::text[], $2::text[]) AS x(node_id, boot)
             WHERE n.node_id = x.node_id",
            &[
                (&heard_ids, Type::TEXT_ARRAY),
                (&heard_boots, Type::TEXT_ARRAY),
                (&at, Type::FLOAT8),
            ],
        )
        .await?;
    }
    writes.flush(tx).await?;
    Ok(out)
}

impl Store {
    /// Lets time pass for every node that needs it (not plainly healthy and
    /// active, or whose heartbeat is stale): silent nodes turn suspect,
    /// then lost; hold-downs end; `wait` drains reach their deadlines; and
    /// whatever both axes decide is carried out again. The leader runs it
    /// from the scheduling loop.
    ///
    /// It decides on a snapshot read without locks, then changes each node
    /// that needs it in a transaction of its own, taking the node's lock
    /// only if it is free (`SKIP LOCKED`: a node whose agent is syncing is
    /// being heard from, and is looked at again on the next tick). So a
    /// sync never waits on the tick for more than one node's change, and a
    /// tick over thousands of suspect nodes holds no lock across them.
    ///
    /// Silent nodes are declared lost at a pace, and not at all during a
    /// mass silence ([`gangway_health::HealthPolicy::silence_verdict`]).
    pub async fn health_tick(&self, ctx: &HealthContext) -> Result<NodesOutcome> {
        let mut conn = self.conn().await?;
        // A heartbeat is recorded at least every third of the suspect
        // limit: one older than half of it means the node went quiet.
        let quiet_s = ctx.policy.suspect_after_s as f64 / 2.0;
        // The nodes to look at and the fleet's size, sent together, each
        // with its parameters' types (one round trip for both).
        let reading = async {
            conn.query_typed(
                &format!(
                    "SELECT {NODE_COLUMNS},
                            floor(extract(epoch FROM now()))::bigint AS now_s,
                            n.cluster_id IS NOT NULL AS member,
                            EXISTS (SELECT 1 FROM workers w WHERE w.node_id = n.node_id
                                      AND w.state IN ('assigned', 'running', 'checkpointing',
                                                      'stopping')) AS busy
                     FROM nodes n JOIN agents a ON a.agent_id = n.agent_id
                     WHERE n.observed <> 'healthy' OR n.operator_state <> 'active'
                        OR n.last_heartbeat_at IS NULL
                        OR n.last_heartbeat_at < now() - make_interval(secs => $1)
                     ORDER BY n.node_id"
                ),
                &[(&quiet_s, Type::FLOAT8)],
            )
            .await
        };
        let counting = conn.query_typed_one("SELECT count(*) FROM nodes", &[]);
        let (rows, fleet) = tokio::join!(reading, counting);
        let (rows, fleet): (_, i64) = (rows?, fleet?.get(0));
        let now = match rows.first() {
            Some(r) => r.get::<_, i64>("now_s").max(0) as u64,
            None => {
                // Every node healthy and heard from: no silence, mass or not.
                (self.mass_silence).store(false, std::sync::atomic::Ordering::Relaxed);
                return Ok(NodesOutcome::default());
            }
        };
        // Decide on the snapshot. First, silence: how widespread it is, and
        // which nodes it would newly lose (longest silent first).
        let policy = &ctx.policy;
        let mut nodes: Vec<(NodeRow, bool)> = Vec::with_capacity(rows.len());
        let mut silent = 0usize;
        let mut newly_lost: Vec<(u64, usize)> = Vec::new();
        for row in &rows {
            let mut node = NodeRow::from_row(row);
            node.health.tick(policy, now);
            let silence = node.health.silent_s(now);
            if silence.is_some_and(|s| s >= policy.suspect_after_s) {
                silent += 1;
            }
            if let Some(s) = silence.filter(|&s| s >= policy.lost_after_s) {
                let lost = decide(&node.admin, &node.observed(policy, now), node.gpus).lost;
                if lost && node.observed != "lost" {
                    newly_lost.push((s, nodes.len()));
                }
            }
            let busy = row.get::<_, bool>("busy") || row.get::<_, bool>("member");
            nodes.push((node, busy));
        }
        metrics::gauge!("gangway_health_silent_nodes").set(silent as f64);
        let verdict = policy.silence_verdict(silent, fleet.max(0) as usize);
        let was_mass = (self.mass_silence).swap(
            verdict == gangway_health::SilenceVerdict::Hold,
            std::sync::atomic::Ordering::Relaxed,
        );
        // A mass silence is not the machines' doing: it does not count
        // towards their flap damping.
        let excuse = verdict == gangway_health::SilenceVerdict::Hold;
        if excuse {
            for (node, _) in &mut nodes {
                node.health.excuse_silence(policy, now);
            }
        }
        let release = match verdict {
            gangway_health::SilenceVerdict::Hold => 0,
            gangway_health::SilenceVerdict::Lose { .. } if was_mass => {
                // A mass silence just ended: the nodes still silent get
                // their lost countdown back from now (still suspect), as
                // Kubernetes resets its timers when a zone leaves full
                // disruption. Their loss is decided on later ticks.
                let ids: Vec<&str> = nodes
                    .iter()
                    .filter(|(n, _)| {
                        n.observed != "lost"
                            && n.health
                                .silent_s(now)
                                .is_some_and(|s| s >= policy.suspect_after_s)
                    })
                    .map(|(n, _)| n.node_id.as_str())
                    .collect();
                let restarted = conn
                    .execute(
                        "UPDATE nodes SET health = jsonb_set(health, '{last_heartbeat}', to_jsonb($2::bigint))
                         WHERE node_id IN (SELECT node_id FROM nodes WHERE node_id = ANY($1)
                                           ORDER BY node_id FOR UPDATE SKIP LOCKED)
                           AND (health->>'last_heartbeat')::bigint < $2",
                        &[&ids, &(now.saturating_sub(policy.suspect_after_s) as i64)],
                    )
                    .await?;
                tracing::warn!(
                    silent,
                    fleet,
                    restarted,
                    "the mass silence ended: the nodes still silent are suspect, and lost only if \
                     they stay silent for the lost limit from now"
                );
                return Ok(NodesOutcome::default());
            }
            gangway_health::SilenceVerdict::Lose { at_most } => at_most,
        };
        newly_lost.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let held = newly_lost.len().saturating_sub(release);
        for &(_, i) in newly_lost.iter().skip(release) {
            nodes[i].0.hold_silence = true;
        }
        metrics::gauge!("gangway_health_losses_held").set(held as f64);
        if held > 0 {
            tracing::warn!(
                silent,
                fleet,
                held,
                "nodes silent past the lost limit are held suspect, not declared lost: {}",
                if release == 0 {
                    "so many nodes are silent at once that the cause is likely the control plane \
                     or the network"
                } else {
                    "losses are paced"
                }
            );
        }
        // Then which nodes need a change at all.
        let mut due: Vec<(String, bool)> = Vec::new();
        for (node, busy) in nodes {
            let observed = node.observed(policy, now);
            let decision = decide(&node.admin, &observed, node.gpus);
            let usable: Vec<i32> = decision.usable.iter().map(|&g| g as i32).collect();
            let health_json = serde_json::to_value(&node.health).expect("NodeHealth serializes");
            let wait_over =
                matches!(node.admin, Admin::Draining { wait: true, deadline } if deadline <= now);
            let acts =
                (decision.lost || decision.evacuate || !decision.evacuate_gpus.is_empty()) && busy;
            let changed = observed.code() != node.observed
                || usable != node.usable
                || node.stored_health.as_ref() != Some(&health_json);
            if changed || acts || wait_over {
                due.push((node.node_id, node.hold_silence));
            }
        }
        let mut out = NodesOutcome::default();
        for (node_id, hold_silence) in &due {
            let tx = conn.transaction().await?;
            let Some(row) = tx
                .query_opt(
                    &format!(
                        "SELECT {NODE_COLUMNS} FROM nodes n JOIN agents a ON a.agent_id = n.agent_id
                         WHERE n.node_id = $1 FOR UPDATE OF n SKIP LOCKED"
                    ),
                    &[node_id],
                )
                .await?
            else {
                continue; // its agent is syncing it now, or it is gone
            };
            let now = db_now(&tx).await?;
            let mut node = NodeRow::from_row(&row);
            node.hold_silence = *hold_silence;
            node.health.tick(policy, now);
            if excuse {
                node.health.excuse_silence(policy, now);
            }
            out.absorb(reconcile_node(&tx, ctx, now, &mut node, &[]).await?);
            tx.commit().await?;
        }
        Ok(out)
    }

    /// Locks one node for an operator's action; `None` if there is none.
    pub(super) async fn lock_node(tx: &Transaction<'_>, node_id: &str) -> Result<Option<NodeRow>> {
        let row = tx
            .query_opt(
                &format!(
                    "SELECT {NODE_COLUMNS} FROM nodes n JOIN agents a ON a.agent_id = n.agent_id
                     WHERE n.node_id = $1 FOR UPDATE OF n"
                ),
                &[&node_id],
            )
            .await?;
        Ok(row.as_ref().map(NodeRow::from_row))
    }

    /// Applies an operator's change of a node's admin state (cordon,
    /// uncordon, drain), audited, and carries out what it decides.
    pub async fn set_node_admin(
        &self,
        ctx: &HealthContext,
        actor: &str,
        node_id: &str,
        change: AdminChange,
        reason: Option<&str>,
    ) -> Result<std::result::Result<NodesOutcome, NodeRefusal>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let Some(mut node) = Self::lock_node(&tx, node_id).await? else {
            return Ok(Err(NodeRefusal::NotFound));
        };
        let now = db_now(&tx).await?;
        if let Admin::Maintenance { plan } = &node.admin {
            return Ok(Err(NodeRefusal::Conflict(format!(
                "maintenance plan {plan} holds the node; it returns the node when it is done"
            ))));
        }
        let reason_text = reason.map(str::to_string);
        let (action, new_admin, message, detail) = match change {
            AdminChange::Cordon => (
                "node.cordon",
                Admin::Cordoned {
                    reason: reason_text.clone().unwrap_or_default(),
                },
                "cordoned: no new work; running jobs stay".to_string(),
                json!({}),
            ),
            AdminChange::Uncordon => {
                if matches!(node.admin, Admin::Repair { .. })
                    || matches!(
                        node.health.observed(&ctx.policy, now),
                        Observed::NeedsRepair { .. }
                    )
                {
                    // The operator returns the node from repair.
                    node.health.repaired();
                }
                (
                    "node.uncordon",
                    Admin::Active,
                    "returned to service".to_string(),
                    json!({"was": node.admin.code()}),
                )
            }
            AdminChange::Drain { mode, deadline_s } => {
                let deadline = now + deadline_s;
                (
                    "node.drain",
                    Admin::Draining {
                        wait: mode == DrainMode::Wait,
                        deadline,
                    },
                    match mode {
                        DrainMode::Checkpoint => format!(
                            "draining: no new work; jobs asked to checkpoint and move (within \
                             {deadline_s} s)"
                        ),
                        DrainMode::Wait => format!(
                            "draining: no new work; jobs may finish within {deadline_s} s, then \
                             are checkpointed and moved"
                        ),
                    },
                    json!({"mode": mode.as_str(), "deadline_s": deadline_s,
                           "deadline": at(deadline)}),
                )
            }
        };
        let (state, wait, deadline): (&str, Option<bool>, Option<f64>) = match &new_admin {
            Admin::Draining { wait, deadline } => ("draining", Some(*wait), Some(*deadline as f64)),
            other => (other.code(), None, None),
        };
        let stored_reason = match &new_admin {
            Admin::Active => None,
            _ => reason_text.clone(),
        };
        tx.execute(
            "UPDATE nodes SET operator_state = $2, admin_reason = $3, drain_wait = $4,
                    drain_deadline = to_timestamp($5)
             WHERE node_id = $1",
            &[&node_id, &state, &stored_reason, &wait, &deadline],
        )
        .await?;
        if matches!(new_admin, Admin::Active) {
            // Swapped out for a spare and now repaired: into the pool.
            super::spares::refill(&tx, node_id).await?;
        }
        node.admin = new_admin;
        node.admin_reason = stored_reason;
        let mut detail = detail;
        detail["actor"] = json!(actor);
        detail["reason"] = json!(reason);
        node_event(
            &tx,
            node_id,
            "admin",
            &match reason {
                Some(r) => format!("{message} (by {actor}: {r})"),
                None => format!("{message} (by {actor})"),
            },
            detail.clone(),
        )
        .await?;
        insert_audit(&tx, actor, action, node_id, reason, detail).await?;
        let out = reconcile_node(&tx, ctx, now, &mut node, &[]).await?;
        tx.commit().await?;
        Ok(Ok(out))
    }

    /// Injects a fault into a simulated node, as if its agent had reported
    /// it (audited).
    pub async fn inject_fault(
        &self,
        ctx: &HealthContext,
        actor: &str,
        node_id: &str,
        fault: &Fault,
    ) -> Result<std::result::Result<NodesOutcome, NodeRefusal>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let Some(mut node) = Self::lock_node(&tx, node_id).await? else {
            return Ok(Err(NodeRefusal::NotFound));
        };
        if node.executor != "sim" {
            return Ok(Err(NodeRefusal::NotSimulated));
        }
        if let Some(gpu) = fault.gpu() {
            if gpu >= node.gpus {
                return Ok(Err(NodeRefusal::InvalidFault(format!(
                    "node {node_id} has GPUs 0 … {}; there is no GPU {gpu}",
                    node.gpus.saturating_sub(1)
                ))));
            }
        }
        let now = db_now(&tx).await?;
        let policy = &ctx.policy;
        let signal = match fault {
            Fault::Xid { gpu, code } => Some(Signal::Xid {
                gpu: *gpu,
                code: *code,
            }),
            Fault::Ecc {
                gpu,
                single_bit,
                double_bit,
            } => Some(Signal::Ecc {
                gpu: *gpu,
                single_bit: *single_bit,
                double_bit: *double_bit,
            }),
            Fault::Remap {
                gpu,
                pending,
                failed,
            } => Some(Signal::Remap {
                gpu: *gpu,
                pending: *pending,
                failed: *failed,
            }),
            Fault::Thermal {
                gpu,
                celsius,
                throttled,
            } => Some(Signal::Thermal {
                gpu: *gpu,
                celsius: celsius.unwrap_or(policy.temperature_limit_c.saturating_add(5)),
                throttled: throttled.unwrap_or(true),
            }),
            Fault::Nvlink { gpu, errors } => Some(Signal::Nvlink {
                gpu: *gpu,
                errors: errors.unwrap_or(policy.nvlink_error_limit),
            }),
            Fault::NodeDown => {
                tx.execute(
                    "UPDATE nodes SET sim_down = true WHERE node_id = $1",
                    &[&node_id],
                )
                .await?;
                Some(Signal::NodeDown)
            }
            Fault::LinkFlap { silent_s } => {
                let silent = silent_s.unwrap_or(policy.suspect_after_s + 2).max(1);
                tx.execute(
                    "UPDATE nodes SET silent_until = now() + make_interval(secs => $2)
                     WHERE node_id = $1",
                    &[&node_id, &(silent as f64)],
                )
                .await?;
                None
            }
            Fault::Reboot => {
                node.sim_reboots += 1;
                node.sim_down = false;
                tx.execute(
                    "UPDATE nodes SET sim_reboots = $2, sim_down = false, silent_until = NULL,
                            last_heartbeat_at = now()
                     WHERE node_id = $1",
                    &[&node_id, &node.sim_reboots],
                )
                .await?;
                let reported = node.boot_id.clone().unwrap_or_else(|| "sim".into());
                Some(Signal::Heartbeat {
                    boot_id: effective_boot(&reported, node.sim_reboots),
                })
            }
            // As the node's BMC would report its rack's sensors; the node's
            // own health is untouched (see `set_rack_thermal` below).
            Fault::RackThermal { throttled } => Some(Signal::RackThermal {
                throttled: throttled.unwrap_or(true),
            }),
        };
        let detail = json!({"fault": fault, "actor": actor});
        node_event(
            &tx,
            node_id,
            "fault_injected",
            &format!("fault injected by {actor}: {}", fault_words(fault)),
            detail.clone(),
        )
        .await?;
        insert_audit(&tx, actor, "node.fault", node_id, None, detail).await?;
        let effects = match &signal {
            Some(s) => node.health.observe(policy, now, s),
            None => Vec::new(),
        };
        let rack_changed = match signal {
            Some(Signal::RackThermal { throttled }) => {
                set_rack_thermal(&tx, node_id, throttled).await?
            }
            _ => false,
        };
        let mut out = reconcile_node(&tx, ctx, now, &mut node, &effects).await?;
        out.fleet_changed |= rack_changed;
        tx.commit().await?;
        Ok(Ok(out))
    }

    /// Every node of the region (or of one leaf) as operators see it,
    /// decided at the database's now.
    pub async fn list_nodes(
        &self,
        policy: &HealthPolicy,
        leaf: Option<&str>,
    ) -> Result<Vec<NodeView>> {
        self.node_views(policy, None, leaf).await
    }

    /// One node with its newest events, or `None`.
    pub async fn get_node(&self, policy: &HealthPolicy, node_id: &str) -> Result<Option<NodeView>> {
        let Some(mut view) = self.node_views(policy, Some(node_id), None).await?.pop() else {
            return Ok(None);
        };
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT * FROM (SELECT event_id, at, kind, message, detail FROM node_events
                                WHERE node_id = $1 ORDER BY event_id DESC LIMIT 50) e
                 ORDER BY event_id",
                &[&node_id],
            )
            .await?;
        view.events = rows
            .iter()
            .map(|r| NodeEvent {
                id: r.get("event_id"),
                at: r.get("at"),
                kind: r.get("kind"),
                message: r.get("message"),
                detail: r.get("detail"),
            })
            .collect();
        Ok(Some(view))
    }

    async fn node_views(
        &self,
        policy: &HealthPolicy,
        only: Option<&str>,
        leaf: Option<&str>,
    ) -> Result<Vec<NodeView>> {
        let mut conn = self.conn().await?;
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let now = db_now(&tx).await?;
        let rows = tx
            .query(
                &format!(
                    "SELECT {NODE_COLUMNS} FROM nodes n JOIN agents a ON a.agent_id = n.agent_id
                     WHERE ($1::text IS NULL OR n.node_id = $1)
                       AND ($2::text IS NULL OR n.leaf = $2)
                     ORDER BY n.node_id"
                ),
                &[&only, &leaf],
            )
            .await?;
        // Racks (leaves) with a node reporting thermal throttling.
        let hot_racks: std::collections::BTreeSet<String> = tx
            .query("SELECT DISTINCT leaf FROM nodes WHERE rack_throttled", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let held = tx
            .query(
                "SELECT node_id, array_agg(DISTINCT gpu_index) AS gpus,
                        array_agg(DISTINCT job_id) AS jobs
                 FROM allocations
                 WHERE released_at IS NULL AND ($1::text IS NULL OR node_id = $1)
                   AND ($2::text IS NULL
                        OR node_id IN (SELECT node_id FROM nodes WHERE leaf = $2))
                 GROUP BY node_id",
                &[&only, &leaf],
            )
            .await?;
        tx.commit().await?;
        let mut allocated: BTreeMap<String, (Vec<i32>, Vec<Uuid>)> = BTreeMap::new();
        for r in &held {
            allocated.insert(r.get(0), (r.get(1), r.get(2)));
        }
        let views = rows
            .iter()
            .map(|row| {
                let node = NodeRow::from_row(row);
                let observed = node.health.observed(policy, now);
                let d = decide(&node.admin, &observed, node.gpus);
                let (gpus, jobs) = allocated.remove(&node.node_id).unwrap_or_default();
                let (drain_mode, drain_deadline) = match node.admin {
                    Admin::Draining { wait, deadline } => (
                        Some(if wait {
                            DrainMode::Wait
                        } else {
                            DrainMode::Checkpoint
                        }),
                        at(deadline),
                    ),
                    _ => (None, None),
                };
                let mut jobs = jobs;
                jobs.sort();
                let spare: bool = row.get("spare");
                let leaf: String = row.get("leaf");
                let rack_throttled = hot_racks.contains(&leaf);
                NodeView {
                    region: self.region().to_string(),
                    agent_id: node.agent_id.clone(),
                    executor: node.executor.clone(),
                    spine: row.get("spine"),
                    nvlink_domain: row.get("nvlink_domain"),
                    gpu_type: row.get("gpu_type"),
                    spare,
                    gpus: node.gpus,
                    admin_state: node.admin.code().to_string(),
                    admin_reason: node.admin_reason.clone(),
                    drain_mode,
                    drain_deadline,
                    observed: observed.code().to_string(),
                    observed_detail: serde_json::to_value(&observed).unwrap_or_default(),
                    schedulable: d.schedulable && !spare && !rack_throttled,
                    usable_gpus: if spare { Vec::new() } else { d.usable.clone() },
                    allocated_gpus: {
                        let mut g: Vec<u32> = gpus.iter().map(|&g| g as u32).collect();
                        g.sort_unstable();
                        g
                    },
                    drained: matches!(node.admin, Admin::Draining { .. }) && jobs.is_empty(),
                    jobs,
                    // The node's own reason first, then its rack's.
                    why: match (&d.why, rack_throttled, spare) {
                        (Some(why), _, _) => Some(why.clone()),
                        (None, true, _) => Some(rack_throttled_why(&leaf)),
                        (None, false, true) => Some("in the spare pool".into()),
                        (None, false, false) => None,
                    },
                    rack_throttled,
                    gpu_power_w: row
                        .get::<_, Option<i32>>("gpu_power_w")
                        .map(|w| w.max(0) as u32),
                    rack_power_budget_w: row
                        .get::<_, Option<i64>>("rack_power_budget_w")
                        .map(|w| w.max(0) as u64),
                    leaf,
                    boot_id: node.boot_id.clone(),
                    last_heartbeat: row.get("last_heartbeat_at"),
                    events: Vec::new(),
                    node_id: node.node_id,
                }
            })
            .collect();
        Ok(views)
    }
}

/// An operator's change of a node's admin state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminChange {
    Cordon,
    Uncordon,
    Drain { mode: DrainMode, deadline_s: u64 },
}

fn fault_words(f: &Fault) -> String {
    match f {
        Fault::Xid { gpu, code } => format!("XID {code} on GPU {gpu}"),
        Fault::Ecc {
            gpu,
            single_bit,
            double_bit,
        } => format!("ECC on GPU {gpu}: {single_bit} single-bit, {double_bit} double-bit"),
        Fault::Remap {
            gpu,
            pending,
            failed,
        } => format!("row remap on GPU {gpu}: pending {pending}, failed {failed}"),
        Fault::Thermal {
            gpu,
            celsius,
            throttled,
        } => format!(
            "thermal on GPU {gpu}: {} °C{}",
            celsius.map_or("hot".into(), |c| c.to_string()),
            if throttled.unwrap_or(true) {
                ", throttling"
            } else {
                ""
            }
        ),
        Fault::Nvlink { gpu, errors } => format!(
            "NVLink errors on GPU {gpu}: {}",
            errors.map_or("past the limit".into(), |e| e.to_string())
        ),
        Fault::NodeDown => "the node dies".into(),
        Fault::LinkFlap { silent_s } => format!(
            "the node's link drops{}",
            silent_s.map_or(String::new(), |s| format!(" for {s} s"))
        ),
        Fault::Reboot => "the node reboots".into(),
        Fault::RackThermal { throttled } => if throttled.unwrap_or(true) {
            "the node's rack throttles (thermal)"
        } else {
            "the node's rack no longer throttles (thermal)"
        }
        .into(),
    }
}

/// Appends one entry to the audit log, inside the action's transaction.
pub(super) async fn insert_audit(
    tx: &Transaction<'_>,
    actor: &str,
    action: &str,
    target: &str,
    reason: Option<&str>,
    detail: serde_json::Value,
) -> Result<()> {
    tx.execute(
        "INSERT INTO audit_log (actor, action, target, reason, detail) VALUES ($1, $2, $3, $4, $5)",
        &[&actor, &action, &target, &reason, &detail],
    )
    .await?;
    Ok(())
}
