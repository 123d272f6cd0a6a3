//! The region's inventory: which machines belong to the region, where each
//! sits in the topology, and which agent may serve it (`V23`).
//!
//! The inventory is operator intent — the region's `--inventory` fleet
//! file, loaded at every start, and `gangway admin node add` / `admit` —
//! and it, not the agent, owns a node's place: registration takes spine,
//! leaf, NVLink domain, spare and rack budget from here. A machine the
//! inventory does not have is refused (`unknown_node`) and kept in
//! `unknown_nodes`, listed as `unknown` for an operator to admit.

use gangway_shared::api::{InventoryEntry, UnknownNode};
use gangway_shared::error::codes;
use gangway_shared::fleet::{valid_node_name, FleetNode};
use serde_json::json;

use super::nodes::insert_audit;
use super::{Result, Store, StoreError};

/// One machine of the inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryNode {
    pub node_id: String,
    /// The agent that may serve it; `None`: an agent named as the node.
    pub agent_id: Option<String>,
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
    pub spare: bool,
    /// The GPU type it must report; `None`: whatever it reports.
    pub gpu_type: Option<String>,
    pub rack_power_budget_w: Option<u64>,
}

impl InventoryNode {
    /// The agent that may serve the node.
    pub fn agent(&self) -> &str {
        self.agent_id.as_deref().unwrap_or(&self.node_id)
    }

    /// A fleet file's machine: a named one is served by its own agent, a
    /// counted (simulated) one by `sim_agent`.
    pub fn from_fleet(node: &FleetNode, sim_agent: &str) -> InventoryNode {
        InventoryNode {
            node_id: node.node_id.clone(),
            agent_id: (!node.named).then(|| sim_agent.to_string()),
            spine: node.spine.clone(),
            leaf: node.leaf.clone(),
            nvlink_domain: node.nvlink_domain.clone(),
            spare: node.spare,
            gpu_type: Some(node.gpu_type.clone()),
            rack_power_budget_w: node.rack_power_budget_w,
        }
    }

    /// The place an agent says `node` has, served by `agent`: what tests
    /// and benchmarks that register nodes straight into the store admit
    /// first.
    pub fn as_registered(node: &gangway_shared::agent::AgentNode, agent: &str) -> InventoryNode {
        InventoryNode {
            node_id: node.node_id.clone(),
            agent_id: Some(agent.to_string()),
            spine: node.spine.clone(),
            leaf: node.leaf.clone(),
            nvlink_domain: node.nvlink_domain.clone(),
            spare: node.spare,
            gpu_type: None,
            rack_power_budget_w: node.rack_power_budget_w,
        }
    }

    /// An operator's entry for `node_id`, checked.
    pub fn from_entry(node_id: &str, e: &InventoryEntry) -> Result<InventoryNode> {
        let bad = |m: String| StoreError::Invalid {
            code: codes::INVALID_NODE,
            message: m,
        };
        if !valid_node_name(node_id) {
            return Err(bad(format!(
                "node id {node_id:?} must be 1-200 letters, digits, '.', '_' or '-'"
            )));
        }
        for (what, v) in [("spine", &e.spine), ("leaf", &e.leaf)] {
            if !valid_node_name(v) {
                return Err(bad(format!(
                    "{what} {v:?} must be 1-200 letters, digits, '.', '_' or '-' \
                     (where the node sits: name its {what} as the region's other nodes do)"
                )));
            }
        }
        for (what, v) in [
            ("nvlink_domain", &e.nvlink_domain),
            ("gpu_type", &e.gpu_type),
            ("agent_id", &e.agent_id),
        ] {
            if v.as_deref().is_some_and(|v| !valid_node_name(v)) {
                return Err(bad(format!(
                    "{what} must be 1-200 letters, digits, '.', '_' or '-'"
                )));
            }
        }
        if e.rack_power_budget_w == Some(0) {
            return Err(bad("rack_power_budget_w must be at least 1".into()));
        }
        Ok(InventoryNode {
            node_id: node_id.to_string(),
            agent_id: e.agent_id.clone().filter(|a| a != node_id),
            spine: e.spine.clone(),
            leaf: e.leaf.clone(),
            nvlink_domain: e
                .nvlink_domain
                .clone()
                .unwrap_or_else(|| node_id.to_string()),
            spare: e.spare,
            gpu_type: e.gpu_type.clone(),
            rack_power_budget_w: e.rack_power_budget_w,
        })
    }
}

const UPSERT: &str = "
    INSERT INTO inventory (node_id, agent_id, spine, leaf, nvlink_domain, spare, gpu_type,
                           rack_power_budget_w, source, added_by)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[],
                         $7::text[], $8::bigint[], $9::text[], $10::text[])
    ON CONFLICT (node_id) DO UPDATE
      SET agent_id = EXCLUDED.agent_id, spine = EXCLUDED.spine, leaf = EXCLUDED.leaf,
          nvlink_domain = EXCLUDED.nvlink_domain, spare = EXCLUDED.spare,
          gpu_type = EXCLUDED.gpu_type, rack_power_budget_w = EXCLUDED.rack_power_budget_w,
          source = EXCLUDED.source, added_by = EXCLUDED.added_by, added_at = now()
      -- the fleet file does not undo an operator's own entry
      WHERE EXCLUDED.source = 'operator' OR inventory.source <> 'operator'";

impl Store {
    /// Adds `nodes` to the inventory, or moves them, as `source` (`fleet`:
    /// the region's fleet file, whose entries never replace an operator's;
    /// `operator`). Returns how many entries were written.
    pub async fn load_inventory(&self, nodes: &[InventoryNode], source: &str) -> Result<u64> {
        let conn = self.conn().await?;
        upsert(&**conn, nodes, source, None).await
    }

    /// An operator's `gangway admin node add` (`must_be_unknown` false: any
    /// machine, before or after it first tried to join) or `admit` (true: a
    /// machine listed as unknown; else `NotFound`). Audited (`node.add`,
    /// `node.admit`); the machine's next registration is accepted.
    pub async fn admit_node(
        &self,
        actor: &str,
        node_id: &str,
        entry: &InventoryEntry,
        must_be_unknown: bool,
    ) -> Result<InventoryNode> {
        let node = InventoryNode::from_entry(node_id, entry)?;
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let was_unknown = tx
            .execute("DELETE FROM unknown_nodes WHERE node_id = $1", &[&node_id])
            .await?
            > 0;
        if must_be_unknown && !was_unknown {
            return Err(StoreError::NotFound);
        }
        upsert(&*tx, std::slice::from_ref(&node), "operator", Some(actor)).await?;
        let action = if must_be_unknown {
            "node.admit"
        } else {
            "node.add"
        };
        insert_audit(
            &tx,
            actor,
            action,
            node_id,
            entry.reason.as_deref(),
            json!({
                "spine": node.spine, "leaf": node.leaf, "nvlink_domain": node.nvlink_domain,
                "spare": node.spare, "gpu_type": node.gpu_type, "agent_id": node.agent(),
                "was_unknown": was_unknown,
            }),
        )
        .await?;
        tx.commit().await?;
        Ok(node)
    }

    /// Puts `req`'s nodes in the inventory where it says they sit, served by
    /// its agent: for tests and benchmarks that register nodes straight
    /// into the store, as a region's fleet file would have placed them.
    pub async fn admit_as_registered(
        &self,
        req: &gangway_shared::agent::RegisterRequest,
    ) -> Result<u64> {
        let nodes: Vec<InventoryNode> = (req.nodes.iter())
            .map(|n| InventoryNode::as_registered(n, &req.agent_id))
            .collect();
        self.load_inventory(&nodes, "operator").await
    }

    /// The machines refused as not in the inventory, by name.
    pub async fn unknown_nodes(&self) -> Result<Vec<UnknownNode>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT node_id, agent_id, executor, gpu_type, gpus, address, first_seen_at,
                        last_seen_at
                 FROM unknown_nodes ORDER BY node_id",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| UnknownNode {
                node_id: r.get("node_id"),
                state: "unknown".into(),
                agent_id: r.get("agent_id"),
                executor: r.get("executor"),
                gpu_type: r.get("gpu_type"),
                gpus: r.get::<_, i32>("gpus").max(0) as u32,
                address: r.get("address"),
                first_seen_at: r.get("first_seen_at"),
                last_seen_at: r.get("last_seen_at"),
            })
            .collect())
    }

    /// An operator's takeover command: the agent holding `node_id` loses
    /// its claim, so the next agent to register the node takes it over at
    /// once, alive or not (audited `node.release`). `NotFound`: no agent
    /// ever registered the node.
    pub async fn release_node(
        &self,
        actor: &str,
        node_id: &str,
        reason: Option<&str>,
    ) -> Result<String> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let agent: String = tx
            .query_opt(
                "UPDATE agents a SET claim_released = true FROM nodes n
                 WHERE n.node_id = $1 AND a.agent_id = n.agent_id
                 RETURNING a.agent_id",
                &[&node_id],
            )
            .await?
            .ok_or(StoreError::NotFound)?
            .get(0);
        insert_audit(
            &tx,
            actor,
            "node.release",
            node_id,
            reason,
            json!({ "agent_id": agent }),
        )
        .await?;
        tx.commit().await?;
        Ok(agent)
    }
}

async fn upsert(
    db: &impl tokio_postgres::GenericClient,
    nodes: &[InventoryNode],
    source: &str,
    by: Option<&str>,
) -> Result<u64> {
    let col = |f: fn(&InventoryNode) -> &str| -> Vec<&str> { nodes.iter().map(f).collect() };
    let ids = col(|n| &n.node_id);
    let agents: Vec<Option<&str>> = nodes.iter().map(|n| n.agent_id.as_deref()).collect();
    let spines = col(|n| &n.spine);
    let leaves = col(|n| &n.leaf);
    let domains = col(|n| &n.nvlink_domain);
    let spares: Vec<bool> = nodes.iter().map(|n| n.spare).collect();
    let types: Vec<Option<&str>> = nodes.iter().map(|n| n.gpu_type.as_deref()).collect();
    let budgets: Vec<Option<i64>> = (nodes.iter())
        .map(|n| n.rack_power_budget_w.and_then(|w| i64::try_from(w).ok()))
        .collect();
    let sources = vec![source; nodes.len()];
    let bys = vec![by; nodes.len()];
    Ok(db
        .execute(
            UPSERT,
            &[
                &ids, &agents, &spines, &leaves, &domains, &spares, &types, &budgets, &sources,
                &bys,
            ],
        )
        .await?)
}
