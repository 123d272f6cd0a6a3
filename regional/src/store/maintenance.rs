//! Rolling maintenance: a persisted plan of nodes to reboot, advanced by
//! the leader on every health tick in capacity-aware waves
//! (`gangway_health::maintenance::next_wave`).
//!
//! Each node of a plan goes `pending → draining → rebooting → checking →
//! done`: draining is the node's `maintenance` operator state, whose
//! decision evacuates it through the drain path (checkpoint, requeue at the
//! front, `cause: maintenance`); once no allocation is left on it, it is
//! told to reboot (a simulated node reboots at once, as the injected
//! `reboot` fault does; a real machine is rebooted by the operator's hook,
//! which watches for nodes in `rebooting`); once its agent reports another
//! boot id it is `checking`, and once it is observed healthy it returns to
//! service (`active`). Every step is a row (`maintenance_steps`), so a
//! control plane restarted mid-way resumes where it was.
//!
//! A pending node out of service for a reason outside the plan when its
//! turn comes goes `pending → skipped` instead (with the reason, in
//! `maintenance_steps.reason` and a node event): at once when the outage
//! lasts (lost, failed, needs repair, in repair, cordoned or drained by an
//! operator), after [`SKIP_AFTER_S`] of waiting for it when it passes
//! (suspect, held down); `maintenance_steps.waiting_since` keeps that wait
//! across ticks and restarts. See `gangway_health::maintenance`.

use std::collections::BTreeMap;

use gangway_health::maintenance::{next_wave, Node, Outage, Step, WaveLimits, SKIP_AFTER_S};
use gangway_health::{Admin, NodeHealth, Signal};
use gangway_shared::api::{
    MaintenanceNode, MaintenancePlan, MaintenancePlanList, MaintenanceStart, SkippedNode,
};
use serde_json::json;
use tokio_postgres::{Row, Transaction};
use uuid::Uuid;

use super::nodes::{
    admin_from_row, db_now, insert_audit, node_event, reconcile_node, HealthContext, NodesOutcome,
};
use super::{Result, Store};

/// Why a maintenance request was refused.
#[derive(Debug)]
pub enum MaintenanceRefusal {
    /// The request names no target, an unknown node, or bad limits.
    Invalid(String),
    /// Another plan is running (start), or this one is not (cancel).
    Conflict(String),
    NotFound,
}

fn step_of(s: &str) -> Option<Step> {
    Some(match s {
        "pending" => Step::Pending,
        "draining" => Step::Draining,
        "rebooting" => Step::Rebooting,
        "checking" => Step::Checking,
        "done" => Step::Done,
        "skipped" => Step::Skipped,
        _ => return None,
    })
}

async fn plan_view(
    tx: &Transaction<'_>,
    region: &str,
    row: &Row,
    with_nodes: bool,
) -> Result<MaintenancePlan> {
    let plan_id: Uuid = row.get("plan_id");
    let steps = tx
        .query(
            "SELECT node_id, step, started_at, finished_at, reason, waiting_since
             FROM maintenance_steps WHERE plan_id = $1 ORDER BY node_id",
            &[&plan_id],
        )
        .await?;
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut skipped = Vec::new();
    for s in &steps {
        let step: String = s.get(1);
        if step == "skipped" {
            skipped.push(SkippedNode {
                node_id: s.get(0),
                reason: s.get::<_, Option<String>>(4).unwrap_or_default(),
                at: s.get(3),
            });
        }
        *counts.entry(step).or_insert(0) += 1;
    }
    Ok(MaintenancePlan {
        plan_id,
        region: region.to_string(),
        state: row.get("state"),
        created_by: row.get("created_by"),
        created_at: row.get("created_at"),
        finished_at: row.get("finished_at"),
        reason: row.get("reason"),
        targets: serde_json::from_value(row.get("targets")).unwrap_or_default(),
        per_leaf: row.get::<_, i32>("per_leaf").max(1) as u32,
        region_percent: row.get::<_, i32>("region_percent").max(1) as u32,
        total: steps.len() as u32,
        steps: counts,
        skipped,
        held: row.get("held"),
        nodes: if with_nodes {
            steps
                .iter()
                .map(|s| MaintenanceNode {
                    node_id: s.get(0),
                    step: s.get(1),
                    started_at: s.get(2),
                    finished_at: s.get(3),
                    reason: s.get(4),
                    waiting_since: s.get(5),
                })
                .collect()
        } else {
            Vec::new()
        },
    })
}

const PLAN_COLUMNS: &str = "plan_id, created_at, created_by, reason, targets, per_leaf, \
    region_percent, state, held, finished_at";

impl Store {
    /// Creates a maintenance plan over the nodes `req` names (audited:
    /// `maintenance.start`). One plan runs at a time.
    pub async fn start_maintenance(
        &self,
        actor: &str,
        req: &MaintenanceStart,
    ) -> Result<std::result::Result<MaintenancePlan, MaintenanceRefusal>> {
        let per_leaf = req.per_leaf.unwrap_or(1);
        let percent = req.region_percent.unwrap_or(10);
        if per_leaf == 0 || per_leaf > 10_000 || percent == 0 || percent > 100 {
            return Ok(Err(MaintenanceRefusal::Invalid(
                "per_leaf must be at least 1 and region_percent between 1 and 100".into(),
            )));
        }
        if !req.all && req.leaf.is_none() && req.gpu_type.is_none() && req.nodes.is_empty() {
            return Ok(Err(MaintenanceRefusal::Invalid(
                "name the nodes to maintain: all, a leaf, a GPU type or a list of nodes".into(),
            )));
        }
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        // One start at a time (the unique index says the same).
        tx.execute("SELECT pg_advisory_xact_lock(7305)", &[])
            .await?;
        if let Some(r) = tx
            .query_opt(
                "SELECT plan_id FROM maintenance_plans WHERE state = 'running'",
                &[],
            )
            .await?
        {
            let id: Uuid = r.get(0);
            return Ok(Err(MaintenanceRefusal::Conflict(format!(
                "maintenance plan {id} is running; cancel it or wait for it to finish"
            ))));
        }
        if !req.nodes.is_empty() {
            let known: Vec<String> = tx
                .query(
                    "SELECT node_id FROM nodes WHERE node_id = ANY($1)",
                    &[&req.nodes],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if let Some(missing) = req.nodes.iter().find(|n| !known.contains(n)) {
                return Ok(Err(MaintenanceRefusal::Invalid(format!(
                    "there is no node {missing} in this region"
                ))));
            }
        }
        let nodes: Vec<String> = tx
            .query(
                "SELECT node_id FROM nodes
                 WHERE NOT spare AND ($1::text IS NULL OR leaf = $1)
                   AND ($2::text IS NULL OR gpu_type = $2)
                   AND (cardinality($3::text[]) = 0 OR node_id = ANY($3))
                 ORDER BY node_id",
                &[&req.leaf, &req.gpu_type, &req.nodes],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if nodes.is_empty() {
            return Ok(Err(MaintenanceRefusal::Invalid(
                "the targets name no (non-spare) node of this region".into(),
            )));
        }
        let id = Uuid::new_v4();
        let targets = serde_json::to_value(req).expect("MaintenanceStart serializes");
        let reason = req
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty());
        let row = tx
            .query_one(
                &format!(
                    "INSERT INTO maintenance_plans (plan_id, created_by, reason, targets, per_leaf,
                                                    region_percent)
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING {PLAN_COLUMNS}"
                ),
                &[
                    &id,
                    &actor,
                    &reason,
                    &targets,
                    &(per_leaf as i32),
                    &(percent as i32),
                ],
            )
            .await?;
        tx.execute(
            "INSERT INTO maintenance_steps (plan_id, node_id) SELECT $1, unnest($2::text[])",
            &[&id, &nodes],
        )
        .await?;
        insert_audit(
            &tx,
            actor,
            "maintenance.start",
            &id.to_string(),
            reason,
            json!({"targets": targets, "nodes": nodes.len(), "per_leaf": per_leaf,
                   "region_percent": percent}),
        )
        .await?;
        let view = plan_view(&tx, self.region(), &row, false).await?;
        tx.commit().await?;
        Ok(Ok(view))
    }

    /// Every plan, newest first.
    pub async fn list_maintenance(&self) -> Result<MaintenancePlanList> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let rows = tx
            .query(
                &format!(
                    "SELECT {PLAN_COLUMNS} FROM maintenance_plans ORDER BY created_at DESC LIMIT 100"
                ),
                &[],
            )
            .await?;
        let mut plans = Vec::with_capacity(rows.len());
        for r in &rows {
            plans.push(plan_view(&tx, self.region(), r, false).await?);
        }
        tx.commit().await?;
        Ok(MaintenancePlanList { plans })
    }

    /// One plan with every node's step.
    pub async fn get_maintenance(&self, id: Uuid) -> Result<Option<MaintenancePlan>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let Some(row) = tx
            .query_opt(
                &format!("SELECT {PLAN_COLUMNS} FROM maintenance_plans WHERE plan_id = $1"),
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let view = plan_view(&tx, self.region(), &row, true).await?;
        tx.commit().await?;
        Ok(Some(view))
    }

    /// Cancels a running plan (audited: `maintenance.cancel`): nodes not
    /// started stay as they are; nodes it took out return to service (the
    /// health policy still decides whether they take work).
    pub async fn cancel_maintenance(
        &self,
        ctx: &HealthContext,
        actor: &str,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<std::result::Result<MaintenancePlan, MaintenanceRefusal>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let Some(row) = tx
            .query_opt(
                "SELECT state FROM maintenance_plans WHERE plan_id = $1 FOR UPDATE",
                &[&id],
            )
            .await?
        else {
            return Ok(Err(MaintenanceRefusal::NotFound));
        };
        let state: String = row.get(0);
        if state != "running" {
            return Ok(Err(MaintenanceRefusal::Conflict(format!(
                "maintenance plan {id} is {state}, not running"
            ))));
        }
        let now = db_now(&tx).await?;
        let out_nodes: Vec<String> = tx
            .query(
                "UPDATE maintenance_steps SET step = 'cancelled', finished_at = now(),
                        waiting_since = NULL
                 WHERE plan_id = $1 AND step NOT IN ('done', 'skipped', 'cancelled')
                 RETURNING node_id",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut sorted = out_nodes.clone();
        sorted.sort();
        for node_id in &sorted {
            let Some(mut node) = Self::lock_node(&tx, node_id).await? else {
                continue;
            };
            if matches!(&node.admin, Admin::Maintenance { plan } if *plan == id.to_string()) {
                return_node(
                    &tx,
                    ctx,
                    now,
                    &mut node,
                    "maintenance cancelled: returned to service",
                )
                .await?;
            }
        }
        tx.execute(
            "UPDATE maintenance_plans SET state = 'cancelled', finished_at = now(), held = NULL
             WHERE plan_id = $1",
            &[&id],
        )
        .await?;
        insert_audit(
            &tx,
            actor,
            "maintenance.cancel",
            &id.to_string(),
            reason,
            json!({"unfinished": out_nodes.len()}),
        )
        .await?;
        tx.execute(
            "UPDATE sched_state SET generation = generation + 1 WHERE id = 1",
            &[],
        )
        .await?;
        let row = tx
            .query_one(
                &format!("SELECT {PLAN_COLUMNS} FROM maintenance_plans WHERE plan_id = $1"),
                &[&id],
            )
            .await?;
        let view = plan_view(&tx, self.region(), &row, false).await?;
        tx.commit().await?;
        Ok(Ok(view))
    }

    /// Advances the running plan, if any: moves each node it has out one
    /// step when it can, and starts the next wave. The leader calls it on
    /// every health tick; idempotent, and everything is in the database.
    pub async fn maintenance_tick(&self, ctx: &HealthContext) -> Result<NodesOutcome> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let mut out = NodesOutcome::default();
        let Some(plan) = tx
            .query_opt(
                "SELECT plan_id, per_leaf, region_percent FROM maintenance_plans
                 WHERE state = 'running' FOR UPDATE SKIP LOCKED",
                &[],
            )
            .await?
        else {
            return Ok(out);
        };
        let plan_id: Uuid = plan.get(0);
        let plan_name = plan_id.to_string();
        let limits = WaveLimits {
            per_leaf: plan.get::<_, i32>(1).max(1) as u32,
            region_percent: plan.get::<_, i32>(2).clamp(1, 100) as u32,
            skip_after_s: SKIP_AFTER_S,
        };
        let now = db_now(&tx).await?;

        // 1. The nodes it has out, one step each when they can.
        let active = tx
            .query(
                "SELECT s.node_id, s.step, s.boot_before, n.health->>'boot_id' AS boot,
                        n.observed, a.executor,
                        EXISTS (SELECT 1 FROM allocations x
                                WHERE x.node_id = n.node_id AND x.released_at IS NULL) AS busy
                 FROM maintenance_steps s JOIN nodes n USING (node_id)
                 JOIN agents a ON a.agent_id = n.agent_id
                 WHERE s.plan_id = $1 AND s.step IN ('draining', 'rebooting', 'checking')
                 ORDER BY s.node_id",
                &[&plan_id],
            )
            .await?;
        for r in &active {
            let node_id: String = r.get("node_id");
            let step: String = r.get("step");
            let boot: Option<String> = r.get("boot");
            match step.as_str() {
                "draining" if !r.get::<_, bool>("busy") => {
                    let Some(mut node) = Self::lock_node(&tx, &node_id).await? else {
                        continue;
                    };
                    tx.execute(
                        "UPDATE maintenance_steps SET step = 'rebooting', boot_before = $3
                         WHERE plan_id = $1 AND node_id = $2",
                        &[&plan_id, &node_id, &boot],
                    )
                    .await?;
                    if node.executor == "sim" {
                        // A simulated machine reboots at once (as the
                        // injected `reboot` fault).
                        node_event(
                            &tx,
                            &node_id,
                            "admin",
                            &format!("maintenance {plan_name}: drained; rebooting"),
                            json!({"plan": plan_name, "step": "rebooting"}),
                        )
                        .await?;
                        node.sim_reboots += 1;
                        tx.execute(
                            "UPDATE nodes SET sim_reboots = $2, sim_down = false,
                                    silent_until = NULL, last_heartbeat_at = now()
                             WHERE node_id = $1",
                            &[&node_id, &node.sim_reboots],
                        )
                        .await?;
                        let reported = node.boot_id.clone().unwrap_or_else(|| "sim".into());
                        let signal = Signal::Heartbeat {
                            boot_id: super::nodes::effective_boot(&reported, node.sim_reboots),
                        };
                        let effects = node.health.observe(&ctx.policy, now, &signal);
                        out.absorb(reconcile_node(&tx, ctx, now, &mut node, &effects).await?);
                    } else {
                        node_event(
                            &tx,
                            &node_id,
                            "admin",
                            &format!(
                                "maintenance {plan_name}: drained; waiting for the machine to \
                                 reboot (the operator's reboot hook)"
                            ),
                            json!({"plan": plan_name, "step": "rebooting"}),
                        )
                        .await?;
                    }
                }
                "rebooting" => {
                    let before: Option<String> = r.get("boot_before");
                    if boot.is_some() && boot != before {
                        tx.execute(
                            "UPDATE maintenance_steps SET step = 'checking'
                             WHERE plan_id = $1 AND node_id = $2",
                            &[&plan_id, &node_id],
                        )
                        .await?;
                        node_event(
                            &tx,
                            &node_id,
                            "admin",
                            &format!("maintenance {plan_name}: back with a new boot id; checking its health"),
                            json!({"plan": plan_name, "step": "checking", "boot_id": boot}),
                        )
                        .await?;
                    }
                }
                "checking" if r.get::<_, String>("observed") == "healthy" => {
                    let Some(mut node) = Self::lock_node(&tx, &node_id).await? else {
                        continue;
                    };
                    tx.execute(
                        "UPDATE maintenance_steps SET step = 'done', finished_at = now()
                         WHERE plan_id = $1 AND node_id = $2",
                        &[&plan_id, &node_id],
                    )
                    .await?;
                    out.absorb(
                        return_node(
                            &tx,
                            ctx,
                            now,
                            &mut node,
                            &format!("maintenance {plan_name}: rebooted and healthy; returned to service"),
                        )
                        .await?,
                    );
                }
                _ => {}
            }
        }

        // 2. The next wave. Nodes out of service for another reason than
        // this plan say why (both axes, as `decide` sees them now), so
        // that one out at its turn can be skipped with its reason.
        let rows = tx
            .query(
                "SELECT n.node_id, n.leaf, s.step,
                        (n.operator_state <> 'active' OR n.observed NOT IN ('healthy', 'degraded'))
                            AS unavailable,
                        n.operator_state, n.admin_reason, n.drain_wait,
                        extract(epoch FROM n.drain_deadline)::bigint AS drain_deadline_s,
                        n.observed,
                        CASE WHEN n.operator_state <> 'active'
                                  OR n.observed NOT IN ('healthy', 'degraded')
                             THEN n.health END AS health,
                        floor(extract(epoch FROM now() - s.waiting_since))::bigint AS waited_s
                 FROM nodes n
                 LEFT JOIN maintenance_steps s ON s.node_id = n.node_id AND s.plan_id = $1
                 WHERE NOT n.spare
                 ORDER BY n.node_id",
                &[&plan_id],
            )
            .await?;
        let gangs = tx
            .query(
                "SELECT a.node_id, a.job_id::text, j.state::text, count(*)::int
                 FROM allocations a JOIN jobs j USING (job_id)
                 WHERE a.released_at IS NULL AND j.mode = 'gang'
                 GROUP BY a.node_id, a.job_id, j.state",
                &[],
            )
            .await?;
        let mut jobs: BTreeMap<String, Vec<(String, u32, bool)>> = BTreeMap::new();
        for g in &gangs {
            jobs.entry(g.get(0)).or_default().push((
                g.get(1),
                g.get::<_, i32>(3) as u32,
                g.get::<_, String>(2) == "preempting",
            ));
        }
        // Pending nodes seen back in service: a later outage starts a new
        // wait.
        let mut back: Vec<String> = Vec::new();
        let nodes: Vec<Node> = rows
            .iter()
            .map(|r| {
                let id: String = r.get("node_id");
                let step = r
                    .get::<_, Option<String>>("step")
                    .as_deref()
                    .and_then(step_of);
                let on = jobs.remove(&id).unwrap_or_default();
                let outage = (r.get::<_, bool>("unavailable") && !step.is_some_and(Step::is_out))
                    .then(|| outage_of(r, ctx, now));
                let waited_s = r.get::<_, Option<i64>>("waited_s").map(|w| w.max(0) as u64);
                if step == Some(Step::Pending) && outage.is_none() && waited_s.is_some() {
                    back.push(id.clone());
                }
                Node {
                    leaf: r.get("leaf"),
                    outage,
                    waited_s,
                    step,
                    jobs: on.iter().map(|(j, g, _)| (j.clone(), *g)).collect(),
                    moving: on.iter().filter(|o| o.2).map(|o| o.0.clone()).collect(),
                    id,
                }
            })
            .collect();
        let wave = next_wave(&nodes, limits);
        if !back.is_empty() {
            tx.execute(
                "UPDATE maintenance_steps SET waiting_since = NULL
                 WHERE plan_id = $1 AND node_id = ANY($2)",
                &[&plan_id, &back],
            )
            .await?;
        }
        // Out of service at their turn, for good (or for too long): left
        // out, with the reason, recorded as the plan's other steps are.
        for skip in &wave.skip {
            let skipped = tx
                .execute(
                    "UPDATE maintenance_steps SET step = 'skipped', reason = $3,
                            finished_at = now(), waiting_since = NULL
                     WHERE plan_id = $1 AND node_id = $2 AND step = 'pending'",
                    &[&plan_id, &skip.node, &skip.reason],
                )
                .await?;
            if skipped == 0 {
                continue;
            }
            node_event(
                &tx,
                &skip.node,
                "admin",
                &format!(
                    "maintenance {plan_name}: skipped: {} (out of service when its turn came)",
                    skip.reason
                ),
                json!({"plan": plan_name, "step": "skipped", "reason": skip.reason}),
            )
            .await?;
            tracing::info!(plan = %plan_id, node = %skip.node, reason = %skip.reason,
                "maintenance: node skipped");
        }
        // Out for a passing reason at their turn: the wait starts (once).
        if !wave.waiting.is_empty() {
            let started = tx
                .query(
                    "UPDATE maintenance_steps SET waiting_since = now()
                     WHERE plan_id = $1 AND node_id = ANY($2) AND step = 'pending'
                       AND waiting_since IS NULL
                     RETURNING node_id",
                    &[&plan_id, &wave.waiting],
                )
                .await?;
            for r in &started {
                let node_id: String = r.get(0);
                let reason = (nodes.iter().find(|n| n.id == node_id))
                    .and_then(|n| n.outage.as_ref())
                    .map(|o| o.reason.clone())
                    .unwrap_or_default();
                node_event(
                    &tx,
                    &node_id,
                    "admin",
                    &format!(
                        "maintenance {plan_name}: out of service when its turn came ({reason}); \
                         waiting for it, skipped if still out after {} s",
                        limits.skip_after_s
                    ),
                    json!({"plan": plan_name, "step": "pending", "waiting": true,
                           "reason": reason, "skip_after_s": limits.skip_after_s}),
                )
                .await?;
            }
        }
        for node_id in &wave.start {
            let Some(mut node) = Self::lock_node(&tx, node_id).await? else {
                continue;
            };
            if !matches!(node.admin, Admin::Active) {
                continue;
            }
            tx.execute(
                "UPDATE maintenance_steps SET step = 'draining', started_at = now(),
                        waiting_since = NULL
                 WHERE plan_id = $1 AND node_id = $2",
                &[&plan_id, node_id],
            )
            .await?;
            tx.execute(
                "UPDATE nodes SET operator_state = 'maintenance', admin_reason = $2,
                        drain_wait = NULL, drain_deadline = NULL
                 WHERE node_id = $1",
                &[node_id, &plan_name],
            )
            .await?;
            node.admin = Admin::Maintenance {
                plan: plan_name.clone(),
            };
            node.admin_reason = Some(plan_name.clone());
            node_event(
                &tx,
                node_id,
                "admin",
                &format!("maintenance {plan_name}: draining (its jobs checkpoint and move)"),
                json!({"plan": plan_name, "step": "draining"}),
            )
            .await?;
            out.absorb(reconcile_node(&tx, ctx, now, &mut node, &[]).await?);
            out.fleet_changed = true;
        }
        let held = wave.held.as_ref().map(|h| json!(h));
        let left: i64 = tx
            .query_one(
                "SELECT count(*) FROM maintenance_steps
                 WHERE plan_id = $1 AND step NOT IN ('done', 'skipped', 'cancelled')",
                &[&plan_id],
            )
            .await?
            .get(0);
        if left == 0 {
            tx.execute(
                "UPDATE maintenance_plans SET state = 'done', finished_at = now(), held = NULL
                 WHERE plan_id = $1",
                &[&plan_id],
            )
            .await?;
            let skipped: i64 = tx
                .query_one(
                    "SELECT count(*) FROM maintenance_steps WHERE plan_id = $1 AND step = 'skipped'",
                    &[&plan_id],
                )
                .await?
                .get(0);
            tracing::info!(plan = %plan_id, skipped, "maintenance plan done");
        } else {
            tx.execute(
                "UPDATE maintenance_plans SET held = $2 WHERE plan_id = $1
                   AND held IS DISTINCT FROM $2",
                &[&plan_id, &held],
            )
            .await?;
        }
        if out.fleet_changed {
            tx.execute(
                "UPDATE sched_state SET generation = generation + 1 WHERE id = 1",
                &[],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// Returns a node a plan had out to service (`active`) and carries out
/// what that decides. The caller holds the node's row lock.
async fn return_node(
    tx: &Transaction<'_>,
    ctx: &HealthContext,
    now: u64,
    node: &mut super::nodes::NodeRow,
    message: &str,
) -> Result<NodesOutcome> {
    tx.execute(
        "UPDATE nodes SET operator_state = 'active', admin_reason = NULL, drain_wait = NULL,
                drain_deadline = NULL
         WHERE node_id = $1",
        &[&node.node_id],
    )
    .await?;
    node.admin = Admin::Active;
    node.admin_reason = None;
    node_event(tx, &node.node_id, "admin", message, json!({"step": "done"})).await?;
    let mut out = reconcile_node(tx, ctx, now, node, &[]).await?;
    out.fleet_changed = true;
    Ok(out)
}

/// Why a node of the next-wave query (`operator_state`, `admin_reason`,
/// `drain_wait`, `drain_deadline_s`, `observed`, `health`) is out of
/// service, from both axes at `now`. A stored state newer than what its
/// health says at `now` (the health tick has not caught up) counts as a
/// passing outage.
fn outage_of(row: &Row, ctx: &HealthContext, now: u64) -> Outage {
    let health: NodeHealth = row
        .get::<_, Option<serde_json::Value>>("health")
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_else(|| NodeHealth::new(0));
    let admin_reason: Option<String> = row.get("admin_reason");
    Outage::of(
        &admin_from_row(row),
        admin_reason.as_deref(),
        &health.observed(&ctx.policy, now),
    )
    .unwrap_or_else(|| {
        Outage::passing(format!(
            "out of service ({}, {})",
            row.get::<_, String>("operator_state"),
            row.get::<_, String>("observed")
        ))
    })
}
