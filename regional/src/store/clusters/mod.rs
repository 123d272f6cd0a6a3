//! Dedicated clusters: whole nodes bound to one tenant (`nodes.cluster_id`),
//! inside one domain of a topology level; created, resized, healed and
//! deleted here, scheduled as partitions of their own (`plans.rs`).
//!
//! - **Create** is one transaction: it picks free whole nodes (healthy,
//!   active, not spares, nothing allocated or held on them, their agent
//!   live, their rack not throttling) in the tightest domain that has
//!   enough, checks that taking them breaks no capacity reservation's
//!   promise, and binds them all. Refused, nothing is written.
//! - **Scheduling**: a cluster is its own scheduling partition, keyed
//!   [`pool_key`]: its snapshot holds only its nodes and its jobs, with no
//!   quotas or fair share (the nodes are the tenant's), and the shared
//!   pool's snapshots leave both out. A rack that members share with other
//!   nodes has its power budget split by GPUs, as between GPU types.
//! - **Healing** (`member_failed`, from the node-health path in
//!   `nodes.rs`): a member that fails goes to repair, out of the cluster,
//!   and a spare of the cluster's domain (the failed node's leaf first)
//!   takes its place, with the failed node's running gangs held onto it as
//!   for any spare swap (`spares.rs`). With no spare there the cluster is
//!   degraded; [`Store::tend_clusters`] keeps looking.
//! - **Shrink** and **delete** ask the jobs on the nodes given back to
//!   checkpoint and stop first, and unbind a node only once nothing runs
//!   on it ([`Store::tend_clusters`]); a deleted cluster's jobs end
//!   cancelled once stopped.
//!
//! Every membership change runs under the capacity lock that reservation
//! admissions take, moves the region generation (a plan read before it is
//! stale) and the fleet version (the fleet's shape is re-read), and leaves
//! an event on the cluster's timeline.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gangway_sched::Level;
use gangway_shared::api::{
    Cluster, ClusterEvent, ClusterNode, ClusterResize, ClusterSpec, ClusterState, JobSpec,
};
use gangway_shared::error::codes;
use serde_json::json;
use tokio_postgres::{GenericClient, Row, Transaction};
use uuid::Uuid;

mod choice;
mod tend;

pub(crate) use choice::{choices, to_release, Candidate};
use choice::{domain_name, largest_domain, placement_of, tightest};
use tend::{finish_deletes, release_idle};
pub(super) use tend::{member_failed, membership};

use super::rows::{level_of, topology_of};
use super::{Result, Store, StoreError, Who};
use crate::store::plans::level_from_db;

/// The pool key of a cluster's scheduling (`sched_partitions.pool`, the
/// scheduler's pass loops, the fleet's shape): `cluster:<id>`. A GPU
/// type's name never contains `:`. SQL spells it `pool_of(gpu_type,
/// cluster_id)` (regional/sql/functions.sql).
pub fn pool_key(cluster: Uuid) -> String {
    format!("cluster:{cluster}")
}

/// The cluster a partition key names, if it names one.
pub fn cluster_of_key(key: &str) -> Option<Uuid> {
    key.strip_prefix("cluster:")?.parse().ok()
}

/// The partition a job is scheduled in: its cluster's, or its GPU type's.
pub fn job_pool(spec: &JobSpec) -> String {
    match spec.cluster {
        Some(c) => pool_key(c),
        None => spec.gpu_type.clone(),
    }
}

/// A node inside a domain given by `path` (`$n`, a `text[]` from the
/// region down): the SQL condition, with `n` the node.
pub(super) fn in_domain(param: usize) -> String {
    format!(
        "((cardinality(${param}::text[]) < 1 OR n.spine = (${param}::text[])[1])
          AND (cardinality(${param}::text[]) < 2 OR n.leaf = (${param}::text[])[2])
          AND (cardinality(${param}::text[]) < 3 OR n.nvlink_domain = (${param}::text[])[3]))"
    )
}

/// A validated create, ready to bind.
#[derive(Clone, Debug)]
pub struct NewCluster {
    /// Derived from (tenant, key) when keyed
    /// ([`gangway_shared::ids::cluster_id_for_key`]).
    pub id: Uuid,
    pub tenant: String,
    pub idempotency_key: Option<String>,
    pub spec: ClusterSpec,
    /// Nodes of an agent silent this long are not taken.
    pub agent_timeout: Duration,
}

/// What a create, resize or delete did.
#[derive(Clone, Debug)]
pub enum ClusterOutcome {
    /// Done now: the cluster as it is after it.
    Done(Cluster),
    /// A retry of an earlier request with the same key and body: nothing
    /// was done again; the cluster as it is now.
    Replayed(Cluster),
}

impl ClusterOutcome {
    pub fn cluster(&self) -> &Cluster {
        match self {
            ClusterOutcome::Done(c) | ClusterOutcome::Replayed(c) => c,
        }
    }
}

/// What [`Store::tend_clusters`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TendOutcome {
    /// Spares bound to degraded clusters.
    pub healed: usize,
    /// Nodes given back by shrinks and deletes.
    pub released: usize,
    /// Clusters whose delete finished.
    pub deleted: usize,
    /// Jobs asked to checkpoint and stop (nodes being given back).
    pub evacuated: usize,
    /// Queued jobs of deleted clusters cancelled.
    pub cancelled: usize,
}

impl TendOutcome {
    /// Whether what may be scheduled changed.
    pub fn changed(&self) -> bool {
        *self != TendOutcome::default()
    }
}

/// Advisory lock key of membership changes ("gangclus"): creates,
/// resizes, deletes and the tend are one at a time. Creates and grows also
/// take the reservations' lock first, since the nodes they take leave the
/// capacity reservations are admitted on.
const CLUSTER_LOCK_KEY: i64 = 0x6761_6e67_636c_7573;

async fn lock_membership(tx: &Transaction<'_>, with_capacity: bool) -> Result<()> {
    if with_capacity {
        super::reservations::lock_capacity(tx).await?;
    }
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CLUSTER_LOCK_KEY])
        .await?;
    Ok(())
}

/// What may be scheduled and the fleet's shape changed.
async fn bump_fleet(tx: &Transaction<'_>) -> Result<()> {
    tx.execute(
        "UPDATE sched_state SET generation = generation + 1, fleet_version = fleet_version + 1
         WHERE id = 1",
        &[],
    )
    .await?;
    Ok(())
}

pub(super) async fn cluster_event(
    tx: &Transaction<'_>,
    cluster: Uuid,
    kind: &str,
    message: &str,
    details: serde_json::Value,
) -> Result<()> {
    tx.execute(
        "INSERT INTO cluster_events (cluster_id, kind, message, details) VALUES ($1, $2, $3, $4)",
        &[&cluster, &kind, &message, &details],
    )
    .await?;
    tx.execute(
        "UPDATE clusters SET updated_at = now() WHERE cluster_id = $1",
        &[&cluster],
    )
    .await?;
    Ok(())
}

/// Free whole nodes of `gpu_type` inside `domain` that could join a
/// cluster now: not spares, in no cluster, active and healthy with every
/// GPU usable, their agent synced within `timeout_s`, nothing allocated
/// or held on them, their rack not throttling.
async fn free_nodes(
    tx: &Transaction<'_>,
    gpu_type: &str,
    domain: &[String],
    timeout_s: f64,
) -> Result<Vec<Candidate>> {
    let rows = tx
        .query(
            &format!(
                "SELECT n.node_id, n.spine, n.leaf, n.nvlink_domain
                 FROM nodes n JOIN agents a ON a.agent_id = n.agent_id
                 WHERE n.gpu_type = $1 AND NOT n.spare AND n.cluster_id IS NULL
                   AND n.operator_state = 'active' AND n.observed = 'healthy'
                   AND a.last_sync_at > now() - make_interval(secs => $3)
                   AND cardinality(n.usable) = (SELECT count(*) FROM gpus g
                                                WHERE g.node_id = n.node_id)
                   AND NOT EXISTS (SELECT 1 FROM allocations x
                                   WHERE x.node_id = n.node_id AND x.released_at IS NULL)
                   AND NOT EXISTS (SELECT 1 FROM gpu_holds h WHERE h.node_id = n.node_id)
                   AND NOT EXISTS (SELECT 1 FROM nodes r
                                   WHERE r.leaf = n.leaf AND r.rack_throttled)
                   AND {}
                 ORDER BY n.node_id",
                in_domain(2)
            ),
            &[&gpu_type, &domain, &timeout_s],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Candidate {
            node_id: r.get(0),
            spine: r.get(1),
            leaf: r.get(2),
            nvlink_domain: r.get(3),
        })
        .collect())
}

/// Binds `nodes` to `cluster` if every one is still free, after locking
/// them (id order) and the region's scheduling row, so that a plan that
/// placed work on one meanwhile is seen; `false` (nothing bound) if one
/// was taken.
async fn bind(tx: &Transaction<'_>, cluster: Uuid, nodes: &[String]) -> Result<bool> {
    // Nodes first, then the scheduling row: the health path's order.
    // NO KEY UPDATE leaves a concurrent allocation's foreign-key check on
    // the node free to go on (it then commits first, and is seen below).
    tx.query(
        "SELECT 1 FROM nodes WHERE node_id = ANY($1) ORDER BY node_id FOR NO KEY UPDATE",
        &[&nodes],
    )
    .await?;
    bump_fleet(tx).await?;
    let taken: i64 = tx
        .query_one(
            "SELECT count(*) FROM nodes n
             WHERE n.node_id = ANY($1)
               AND (n.spare OR n.cluster_id IS NOT NULL OR n.operator_state <> 'active'
                    OR EXISTS (SELECT 1 FROM allocations x
                               WHERE x.node_id = n.node_id AND x.released_at IS NULL)
                    OR EXISTS (SELECT 1 FROM gpu_holds h WHERE h.node_id = n.node_id))",
            &[&nodes],
        )
        .await?
        .get(0);
    if taken > 0 {
        return Ok(false);
    }
    tx.execute(
        "UPDATE nodes SET cluster_id = $2, cluster_release = false, spare_managed = true
         WHERE node_id = ANY($1)",
        &[&nodes, &cluster],
    )
    .await?;
    Ok(true)
}

fn unavailable(message: String) -> StoreError {
    StoreError::Conflict {
        code: codes::CLUSTER_UNAVAILABLE,
        message,
    }
}

fn invalid(message: String) -> StoreError {
    StoreError::Invalid {
        code: codes::INVALID_CLUSTER,
        message,
    }
}

fn conflict(message: String) -> StoreError {
    StoreError::Conflict {
        code: codes::CLUSTER_CONFLICT,
        message,
    }
}

/// Columns every cluster query selects, in the shape [`cluster_from_row`]
/// reads. `c` is `clusters`.
const CLUSTER_COLUMNS: &str = "c.cluster_id, c.tenant, c.name, c.gpu_type, c.nodes, \
     c.level::text AS level, c.path, c.state, c.created_at, c.updated_at";

/// Each member of `clusters`, by id, as [`ClusterNode`].
async fn members_of<C: GenericClient + Sync>(
    client: &C,
    clusters: &[Uuid],
) -> Result<BTreeMap<Uuid, Vec<ClusterNode>>> {
    let rows = client
        .query(
            "SELECT n.cluster_id, n.node_id, n.spine, n.leaf, n.nvlink_domain, n.cluster_release,
                    n.operator_state = 'active' AND n.observed = 'healthy'
                        AND NOT n.cluster_release AS schedulable,
                    (SELECT count(*) FROM gpus g WHERE g.node_id = n.node_id) AS gpus,
                    (SELECT count(*) FROM allocations a
                     WHERE a.node_id = n.node_id AND a.released_at IS NULL) AS in_use
             FROM nodes n WHERE n.cluster_id = ANY($1) ORDER BY n.node_id",
            &[&clusters],
        )
        .await?;
    let mut out: BTreeMap<Uuid, Vec<ClusterNode>> = BTreeMap::new();
    for r in &rows {
        out.entry(r.get("cluster_id"))
            .or_default()
            .push(ClusterNode {
                node_id: r.get("node_id"),
                spine: r.get("spine"),
                leaf: r.get("leaf"),
                nvlink_domain: r.get("nvlink_domain"),
                gpus: r.get::<_, i64>("gpus").max(0) as u32,
                in_use_gpus: r.get::<_, i64>("in_use").max(0) as u32,
                releasing: r.get("cluster_release"),
                schedulable: r.get("schedulable"),
            });
    }
    Ok(out)
}

/// A cluster's view from its row and its members; its state for people
/// derived from both.
fn cluster_from_row(row: &Row, region: &str, members: Vec<ClusterNode>) -> Cluster {
    let asked = row.get::<_, i32>("nodes").max(0) as u32;
    let kept = members.iter().filter(|m| !m.releasing).count() as u32;
    let state = match row.get::<_, &str>("state") {
        "deleted" => ClusterState::Deleted,
        "deleting" => ClusterState::Deleting,
        _ if members.iter().any(|m| m.releasing) => ClusterState::Resizing,
        _ if kept < asked => ClusterState::Degraded,
        _ => ClusterState::Ready,
    };
    let placement = Level::holding(
        (members.iter()).map(|m| (m.spine.as_str(), m.leaf.as_str(), m.nvlink_domain.as_str())),
    );
    Cluster {
        id: row.get("cluster_id"),
        tenant: row.get("tenant"),
        region: region.to_string(),
        name: row.get("name"),
        gpu_type: row.get("gpu_type"),
        nodes: asked,
        level: topology_of(level_from_db(row.get("level"))),
        domain: row.get("path"),
        placement_level: topology_of(placement),
        state,
        gpus: members.iter().map(|m| m.gpus).sum(),
        in_use_gpus: members.iter().map(|m| m.in_use_gpus).sum(),
        members,
        events: Vec::new(),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}

/// A locked cluster row: (tenant, gpu type, nodes asked, level, path,
/// stored state).
struct Locked {
    tenant: String,
    gpu_type: String,
    nodes: i32,
    level: Level,
    path: Vec<String>,
    state: String,
}

async fn lock_cluster(tx: &Transaction<'_>, tenant: Option<&str>, id: Uuid) -> Result<Locked> {
    let row = tx
        .query_opt(
            "SELECT tenant, gpu_type, nodes, level::text, path, state FROM clusters
             WHERE cluster_id = $1 AND ($2::text IS NULL OR tenant = $2) FOR UPDATE",
            &[&id, &tenant],
        )
        .await?
        .ok_or(StoreError::NotFound)?;
    Ok(Locked {
        tenant: row.get(0),
        gpu_type: row.get(1),
        nodes: row.get(2),
        level: level_from_db(row.get(3)),
        path: row.get(4),
        state: row.get(5),
    })
}

/// The members of a cluster, with their place and GPUs in use.
async fn member_places(tx: &Transaction<'_>, id: Uuid) -> Result<Vec<(Candidate, u32, bool)>> {
    let rows = tx
        .query(
            "SELECT n.node_id, n.spine, n.leaf, n.nvlink_domain,
                    (SELECT count(*) FROM allocations a
                     WHERE a.node_id = n.node_id AND a.released_at IS NULL) AS in_use,
                    n.cluster_release
             FROM nodes n WHERE n.cluster_id = $1 ORDER BY n.node_id",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                Candidate {
                    node_id: r.get(0),
                    spine: r.get(1),
                    leaf: r.get(2),
                    nvlink_domain: r.get(3),
                },
                r.get::<_, i64>(4).max(0) as u32,
                r.get(5),
            )
        })
        .collect())
}

/// Asks the jobs running on `node` to checkpoint and stop (they requeue
/// onto the cluster's other nodes, or, the cluster being deleted, end
/// cancelled); returns how many were asked now.
async fn evacuate_member(tx: &Transaction<'_>, node: &str, why: &str) -> Result<usize> {
    Ok(crate::store::nodes::evacuate(tx, node, None, "drain", why)
        .await?
        .len())
}

impl Store {
    async fn cluster_in<C: GenericClient + Sync>(
        &self,
        client: &C,
        tenant: Option<&str>,
        id: Uuid,
        events: bool,
    ) -> Result<Cluster> {
        let row = client
            .query_opt(
                &format!(
                    "SELECT {CLUSTER_COLUMNS} FROM clusters c
                     WHERE c.cluster_id = $1 AND ($2::text IS NULL OR c.tenant = $2)"
                ),
                &[&id, &tenant],
            )
            .await?
            .ok_or(StoreError::NotFound)?;
        let members = members_of(client, &[id])
            .await?
            .remove(&id)
            .unwrap_or_default();
        let mut c = cluster_from_row(&row, self.region(), members);
        if events {
            let rows = client
                .query(
                    "SELECT at, kind, message, details FROM (
                         SELECT * FROM cluster_events WHERE cluster_id = $1
                         ORDER BY id DESC LIMIT 100) e
                     ORDER BY id",
                    &[&id],
                )
                .await?;
            c.events = rows
                .iter()
                .map(|r| ClusterEvent {
                    at: r.get::<_, DateTime<Utc>>(0),
                    kind: r.get(1),
                    message: r.get(2),
                    details: r.get(3),
                })
                .collect();
        }
        Ok(c)
    }

    /// Binds a cluster's nodes, or returns the cluster an earlier create
    /// with the same key made. One that cannot be made now is
    /// [`StoreError::Conflict`] `cluster_unavailable` with why; nothing is
    /// bound.
    pub async fn create_cluster(&self, new: &NewCluster) -> Result<ClusterOutcome> {
        // A lost race for a node (a plan placed work on it meanwhile) is
        // tried again on what is free then.
        for _ in 0..3 {
            if let Some(done) = self.try_create_cluster(new).await? {
                return Ok(done);
            }
        }
        Err(unavailable(
            "the free nodes kept being taken by other work while the cluster was being made; \
             nothing was bound: try again"
                .into(),
        ))
    }

    async fn try_create_cluster(&self, new: &NewCluster) -> Result<Option<ClusterOutcome>> {
        let spec = &new.spec;
        let request = serde_json::to_value(spec).expect("a ClusterSpec serializes");
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_membership(&tx, true).await?;
        if let Some(key) = &new.idempotency_key {
            let keyed = &super::keyed::CLUSTERS;
            if keyed
                .earlier_create(&tx, new.id, &new.tenant, key, &request)
                .await?
            {
                let c = self
                    .cluster_in(&*tx, Some(&new.tenant), new.id, false)
                    .await?;
                return Ok(Some(ClusterOutcome::Replayed(c)));
            }
        }
        let known: i64 = tx
            .query_one(
                "SELECT count(*) FROM nodes WHERE gpu_type = $1",
                &[&spec.gpu_type],
            )
            .await?
            .get(0);
        if known == 0 {
            return Err(StoreError::Invalid {
                code: codes::UNKNOWN_GPU_TYPE,
                message: format!(
                    "this region has no GPUs of type {:?}; GET /v1/region lists the types it has",
                    spec.gpu_type
                ),
            });
        }
        let level = level_of(spec.level);
        let n = spec.nodes.clamp(1, i64::from(u32::MAX)) as usize;
        let free = free_nodes(&tx, &spec.gpu_type, &[], new.agent_timeout.as_secs_f64()).await?;
        let options = choices(&free, n, level);
        if options.is_empty() {
            return Err(unavailable(format!(
                "no {level} domain has {n} free whole {} nodes (the region has {} free, none \
                 running work, in any one domain at most {}); ask for fewer nodes or a wider \
                 level, or try again when work finishes",
                spec.gpu_type,
                free.len(),
                largest_domain(&free, level)
            )));
        }
        let mut refusal = None;
        for (picked, domain) in options.iter().take(16) {
            let ids: BTreeSet<String> = picked.iter().map(|c| c.node_id.clone()).collect();
            if let Err(why) =
                super::reservations::promises_hold_without(&tx, &spec.gpu_type, &ids).await?
            {
                refusal.get_or_insert(why);
                continue;
            }
            tx.execute(
                "INSERT INTO clusters (cluster_id, tenant, idempotency_key, name, gpu_type, nodes,
                                       level, path, request)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::text::topology_level, $8, $9)",
                &[
                    &new.id,
                    &new.tenant,
                    &new.idempotency_key,
                    &spec.name,
                    &spec.gpu_type,
                    &(n as i32),
                    &level.as_str(),
                    domain,
                    &request,
                ],
            )
            .await?;
            let ids: Vec<String> = ids.into_iter().collect();
            if !bind(&tx, new.id, &ids).await? {
                // Rolled back whole: nothing of this attempt stays.
                return Ok(None);
            }
            let placed = placement_of(picked);
            cluster_event(
                &tx,
                new.id,
                "created",
                &format!(
                    "created with {n} {} node(s) inside one {placed} domain ({} {})",
                    spec.gpu_type,
                    level,
                    domain_name(domain)
                ),
                json!({"nodes": ids, "placement_level": placed.as_str(), "domain": domain}),
            )
            .await?;
            let c = self.cluster_in(&*tx, None, new.id, false).await?;
            tx.commit().await?;
            metrics::counter!("gangway_cluster_changes_total", "change" => "created").increment(1);
            return Ok(Some(ClusterOutcome::Done(c)));
        }
        Err(unavailable(format!(
            "taking the free nodes would break a capacity reservation's promise ({}); nothing \
             was bound: ask for fewer nodes or a wider level",
            refusal.unwrap_or_default()
        )))
    }

    /// A cluster of `tenant`'s (any tenant's for `None`: operators), with
    /// its newest events. Another tenant's is [`StoreError::NotFound`].
    pub async fn get_cluster(&self, tenant: Option<&str>, id: Uuid) -> Result<Cluster> {
        let conn = self.conn().await?;
        self.cluster_in(&**conn, tenant, id, true).await
    }

    /// A tenant's clusters (every tenant's for `None`), newest first;
    /// deleted ones too.
    pub async fn list_clusters(&self, tenant: Option<&str>) -> Result<Vec<Cluster>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {CLUSTER_COLUMNS} FROM clusters c
                     WHERE $1::text IS NULL OR c.tenant = $1
                     ORDER BY c.created_at DESC, c.cluster_id LIMIT 1000"
                ),
                &[&tenant],
            )
            .await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.get("cluster_id")).collect();
        let mut members = members_of(&**conn, &ids).await?;
        Ok(rows
            .iter()
            .map(|r| {
                let id: Uuid = r.get("cluster_id");
                cluster_from_row(r, self.region(), members.remove(&id).unwrap_or_default())
            })
            .collect())
    }

    /// Grows or shrinks a cluster to `resize.nodes`. Growing binds free
    /// nodes of its domain, nearest its nodes first, all or none
    /// (`cluster_unavailable`); shrinking gives back the nodes that keep
    /// the rest tightest, idle ones at once and busy ones once their jobs
    /// have checkpointed and moved. Keyed like a create.
    pub async fn resize_cluster(
        &self,
        who: Who<'_>,
        id: Uuid,
        key: Option<&str>,
        resize: &ClusterResize,
        agent_timeout: Duration,
    ) -> Result<ClusterOutcome> {
        let request = serde_json::to_value(resize).expect("a ClusterResize serializes");
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_membership(&tx, true).await?;
        let c = lock_cluster(&tx, who.tenant(), id).await?;
        if let Some(key) = key {
            if super::keyed::CLUSTERS
                .earlier_change(&tx, &c.tenant, key, id, "resize", &request)
                .await?
            {
                let c = self.cluster_in(&*tx, None, id, false).await?;
                return Ok(ClusterOutcome::Replayed(c));
            }
        }
        if c.state != "active" {
            return Err(conflict(format!(
                "cluster {id} is {}: it can no longer be resized",
                c.state
            )));
        }
        let want = resize.nodes.clamp(1, i64::from(u32::MAX)) as usize;
        let members = member_places(&tx, id).await?;
        let kept: Vec<&(Candidate, u32, bool)> = members.iter().filter(|m| !m.2).collect();
        let mut message = String::new();
        if want > kept.len() {
            // Nodes being given back are kept again first.
            let mut need = want - kept.len();
            let back: Vec<String> = (members.iter())
                .filter(|m| m.2)
                .take(need)
                .map(|m| m.0.node_id.clone())
                .collect();
            need -= back.len();
            if !back.is_empty() {
                tx.execute(
                    "UPDATE nodes SET cluster_release = false WHERE node_id = ANY($1)",
                    &[&back],
                )
                .await?;
            }
            if need > 0 {
                let free =
                    free_nodes(&tx, &c.gpu_type, &c.path, agent_timeout.as_secs_f64()).await?;
                if free.len() < need {
                    return Err(unavailable(format!(
                        "cluster {id} needs {need} more free whole {} node(s) inside its {} \
                         domain {}, and {} are free there; nothing changed: ask for fewer, or \
                         try again when work finishes",
                        c.gpu_type,
                        c.level,
                        domain_name(&c.path),
                        free.len()
                    )));
                }
                let near: Vec<Candidate> = members.iter().map(|m| m.0.clone()).collect();
                let picked = tightest(free.iter().collect(), need, &near);
                let ids: BTreeSet<String> = picked.iter().map(|c| c.node_id.clone()).collect();
                if let Err(why) =
                    super::reservations::promises_hold_without(&tx, &c.gpu_type, &ids).await?
                {
                    return Err(unavailable(format!(
                        "growing cluster {id} would break a capacity reservation's promise \
                         ({why}); nothing changed"
                    )));
                }
                let ids: Vec<String> = ids.into_iter().collect();
                if !bind(&tx, id, &ids).await? {
                    return Err(StoreError::InFlight);
                }
                message = format!("grew by {need} node(s): {}", ids.join(", "));
            } else {
                bump_fleet(&tx).await?;
                message = format!("keeps {} node(s) it was giving back", back.len());
            }
        } else if want < kept.len() {
            let places: Vec<(Candidate, u32)> = kept.iter().map(|m| (m.0.clone(), m.1)).collect();
            let give = to_release(&places, kept.len() - want);
            tx.execute(
                "UPDATE nodes SET cluster_release = true WHERE node_id = ANY($1)",
                &[&give],
            )
            .await?;
            bump_fleet(&tx).await?;
            let why = format!("cluster {id} shrinks to {want} node(s)");
            for node in &give {
                evacuate_member(&tx, node, &why).await?;
            }
            message = format!(
                "shrinks by {} node(s): {} (given back once their jobs are off)",
                give.len(),
                give.join(", ")
            );
        }
        tx.execute(
            "UPDATE clusters SET nodes = $2 WHERE cluster_id = $1",
            &[&id, &(want as i32)],
        )
        .await?;
        cluster_event(
            &tx,
            id,
            "resized",
            &format!(
                "resized from {} to {want} node(s){}{message}",
                c.nodes,
                if message.is_empty() { "" } else { ": " }
            ),
            json!({"from": c.nodes, "to": want}),
        )
        .await?;
        super::keyed::CLUSTERS
            .record(&tx, &c.tenant, key, id, "resize", &request)
            .await?;
        who.audit(
            &tx,
            "cluster.resize",
            id,
            json!({"from": c.nodes, "to": want, "tenant": c.tenant}),
        )
        .await?;
        // Idle nodes given back leave at once.
        release_idle(&tx, id).await?;
        let out = self.cluster_in(&*tx, None, id, false).await?;
        tx.commit().await?;
        metrics::counter!("gangway_cluster_changes_total", "change" => "resized").increment(1);
        Ok(ClusterOutcome::Done(out))
    }

    /// Deletes a cluster: its queued jobs are cancelled, its running ones
    /// asked to checkpoint and stop (they then end cancelled), and its
    /// nodes go back to the region once nothing runs on them
    /// ([`Store::tend_clusters`]; at once when nothing does). Keyed like a
    /// create; deleting a deleted cluster changes nothing.
    pub async fn delete_cluster(
        &self,
        who: Who<'_>,
        id: Uuid,
        key: Option<&str>,
    ) -> Result<ClusterOutcome> {
        let request = json!({});
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_membership(&tx, false).await?;
        let c = lock_cluster(&tx, who.tenant(), id).await?;
        if let Some(key) = key {
            if super::keyed::CLUSTERS
                .earlier_change(&tx, &c.tenant, key, id, "delete", &request)
                .await?
            {
                let c = self.cluster_in(&*tx, None, id, false).await?;
                return Ok(ClusterOutcome::Replayed(c));
            }
        }
        if c.state != "active" {
            super::keyed::CLUSTERS
                .record(&tx, &c.tenant, key, id, "delete", &request)
                .await?;
            let out = self.cluster_in(&*tx, None, id, false).await?;
            tx.commit().await?;
            return Ok(ClusterOutcome::Done(out));
        }
        tx.execute(
            "UPDATE clusters SET state = 'deleting' WHERE cluster_id = $1",
            &[&id],
        )
        .await?;
        // Its nodes take no new work from now on.
        bump_fleet(&tx).await?;
        let why = format!("cluster {id} is being deleted");
        let mut asked = 0;
        for (m, _, _) in member_places(&tx, id).await? {
            asked += evacuate_member(&tx, &m.node_id, &why).await?;
        }
        cluster_event(
            &tx,
            id,
            "deleting",
            &format!(
                "deleting: {asked} running job(s) asked to checkpoint and stop; its nodes go \
                 back to the region once nothing runs on them"
            ),
            json!({"stopping_jobs": asked}),
        )
        .await?;
        super::keyed::CLUSTERS
            .record(&tx, &c.tenant, key, id, "delete", &request)
            .await?;
        who.audit(
            &tx,
            "cluster.delete",
            id,
            json!({"tenant": c.tenant, "stopping_jobs": asked}),
        )
        .await?;
        finish_deletes(&tx, Some(id)).await?;
        let out = self.cluster_in(&*tx, None, id, false).await?;
        tx.commit().await?;
        metrics::counter!("gangway_cluster_changes_total", "change" => "deleted").increment(1);
        Ok(ClusterOutcome::Done(out))
    }

    /// Whether a job naming a cluster may run on it: the tenant's, of the
    /// job's GPU type, not being deleted ([`StoreError::Invalid`]
    /// `invalid_cluster` otherwise). Whether its shape fits the cluster's
    /// nodes is checked against the fleet's shape (`api/validate.rs`).
    pub async fn check_job_cluster(&self, tenant: &str, spec: &JobSpec) -> Result<()> {
        let Some(id) = spec.cluster else {
            return Ok(());
        };
        let conn = self.conn().await?;
        check_job_cluster(&**conn, self.region(), tenant, spec, id).await
    }
}

/// [`Store::check_job_cluster`] on `client`.
pub(super) async fn check_job_cluster<C: GenericClient + Sync>(
    client: &C,
    region: &str,
    tenant: &str,
    spec: &JobSpec,
    id: Uuid,
) -> Result<()> {
    if spec.reservation.is_some() {
        return Err(invalid(
            "a job runs in a reservation or on a cluster, not both; name one".into(),
        ));
    }
    let row = client
        .query_opt(
            "SELECT gpu_type, state FROM clusters WHERE cluster_id = $1 AND tenant = $2",
            &[&id, &tenant],
        )
        .await?;
    let Some(row) = row else {
        return Err(invalid(format!(
            "you have no cluster {id} in region {region}; GET /v1/clusters lists yours"
        )));
    };
    let gpu_type: &str = row.get(0);
    let state: &str = row.get(1);
    if state != "active" {
        return Err(invalid(format!(
            "cluster {id} is {state}: it takes no new jobs; name another one, or none"
        )));
    }
    if gpu_type != spec.gpu_type {
        return Err(invalid(format!(
            "cluster {id} has {gpu_type} nodes, and the job asks for {}",
            spec.gpu_type
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_name_clusters_and_nothing_else() {
        let id = Uuid::new_v4();
        assert_eq!(cluster_of_key(&pool_key(id)), Some(id));
        assert_eq!(cluster_of_key("h100"), None);
        assert_eq!(cluster_of_key("cluster:nope"), None);
    }
}
