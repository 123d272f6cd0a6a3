//! Spare swaps: when a node under a running gang is lost or fails, a spare
//! of the same GPU type takes its place — from the same leaf, else the same
//! spine, else anywhere in the region — and the gang restarts from its
//! checkpoint on its other nodes plus the spare, without going back to the
//! queue.
//!
//! How it is guaranteed the spare (and the gang's other GPUs) go to the
//! gang: when the node fails, the spare leaves the pool (`spare = false`),
//! the failed node goes to repair, and every GPU of the gang's new
//! placement (its old GPUs, the failed node's ranks moved to the same GPU
//! indices of the spare) is *held* for it (`gpu_holds`). The snapshot
//! counts held GPUs as taken while the gang is being preempted, so the
//! planner puts nothing there. When the gang's last worker is down (its
//! job requeues, in `settle_job`), it is placed onto the held GPUs in that
//! same transaction through the planner's own commit path
//! (`apply_placements`: workers assigned with a new attempt, one allocation
//! per GPU under the unique index, a `placed` event). If the holds no
//! longer fit (a held node went out meanwhile), they are dropped and the
//! gang waits at the front of its queue, as without a spare.
//!
//! A swapped-out node carries `refill_spare`: when an operator returns it
//! from repair (uncordon), it joins the spare pool. Nodes whose spare flag
//! the region changed are `spare_managed`: their agent's registration no
//! longer overwrites it.

use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::{Level, Placement, Plan, WorkerPlacement};
use serde_json::json;
use tokio_postgres::Transaction;
use uuid::Uuid;

use super::jobs::insert_event;
use super::nodes::node_event;
use super::Result;

/// One worker of a gang's run: (rank, node, GPUs).
type Slot = (i32, String, Vec<i32>);

/// The running gangs with a worker on `node_id`, each with every worker of
/// its current run; read before their workers are moved.
pub(super) async fn gangs_on(
    tx: &Transaction<'_>,
    node_id: &str,
) -> Result<Vec<(Uuid, Vec<Slot>)>> {
    let rows = tx
        .query(
            "SELECT w.job_id, w.rank, w.node_id, w.gpus
             FROM workers w JOIN jobs j USING (job_id)
             WHERE j.mode = 'gang' AND j.state IN ('starting', 'running')
               AND w.job_id IN (SELECT job_id FROM workers
                                WHERE node_id = $1 AND state IN ('assigned', 'running'))
               AND w.state IN ('assigned', 'running')
               AND (j.run_workers IS NULL OR w.rank < j.run_workers)
             ORDER BY w.job_id, w.rank",
            &[&node_id],
        )
        .await?;
    let mut gangs: BTreeMap<Uuid, Vec<Slot>> = BTreeMap::new();
    for r in &rows {
        gangs
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2), r.get(3)));
    }
    Ok(gangs.into_iter().collect())
}

/// Takes a spare for the gangs that were running on `failed` (from
/// [`gangs_on`], before they were moved), inside the domain `within`
/// (from the region down; empty: anywhere; a cluster's member gets one of
/// its cluster's domain): the spare leaves the pool, the failed node goes
/// to repair, and the gangs' new placements are held.
/// Returns the spare, or `None` when there is no fitting spare (the gangs
/// then simply wait at the front of their queues).
pub(super) async fn swap_in(
    tx: &Transaction<'_>,
    failed: &str,
    why: &str,
    gangs: &[(Uuid, Vec<Slot>)],
    within: &[String],
) -> Result<Option<String>> {
    if gangs.is_empty() {
        return Ok(None);
    }
    let needed: BTreeSet<i32> = gangs
        .iter()
        .flat_map(|(_, slots)| slots.iter())
        .filter(|(_, node, _)| node == failed)
        .flat_map(|(_, _, gpus)| gpus.iter().copied())
        .collect();
    let needed: Vec<i32> = needed.into_iter().collect();
    let Some(place) = tx
        .query_opt(
            "SELECT spine, leaf, gpu_type FROM nodes WHERE node_id = $1",
            &[&failed],
        )
        .await?
    else {
        return Ok(None);
    };
    let (spine, leaf, gpu_type): (String, String, String) =
        (place.get(0), place.get(1), place.get(2));
    let Some(spare) = find_spare(
        tx,
        &gpu_type,
        Some((spine.as_str(), leaf.as_str())),
        Some(failed),
        within,
        Some(&needed),
    )
    .await?
    else {
        let jobs: Vec<Uuid> = gangs.iter().map(|(j, _)| *j).collect();
        node_event(
            tx,
            failed,
            "spare",
            "no spare to swap in: its gangs wait at the front of their queues",
            json!({"jobs": jobs}),
        )
        .await?;
        return Ok(None);
    };
    let spare_id = spare.node_id.clone();
    let domain = spare.domain.as_str();

    tx.execute(
        "UPDATE nodes SET spare = false, spare_managed = true WHERE node_id = $1",
        &[&spare_id],
    )
    .await?;
    let repair_reason = format!("swapped out for spare {spare_id}: {why}");
    tx.execute(
        "UPDATE nodes SET operator_state = 'repair', admin_reason = $2, drain_wait = NULL,
                drain_deadline = NULL, spare_managed = true, refill_spare = true
         WHERE node_id = $1",
        &[&failed, &repair_reason],
    )
    .await?;
    // Holds of gangs no longer being moved are stale.
    tx.execute(
        "DELETE FROM gpu_holds h USING jobs j
         WHERE j.job_id = h.job_id AND j.state <> 'preempting'",
        &[],
    )
    .await?;
    let (mut h_node, mut h_gpu, mut h_job, mut h_rank) = (vec![], vec![], vec![], vec![]);
    for (job, slots) in gangs {
        for (rank, node, gpus) in slots {
            let node = if node == failed { &spare_id } else { node };
            for &g in gpus {
                h_node.push(node.clone());
                h_gpu.push(g);
                h_job.push(*job);
                h_rank.push(*rank);
            }
        }
    }
    tx.execute(
        "INSERT INTO gpu_holds (node_id, gpu_index, job_id, rank)
         SELECT * FROM unnest($1::text[], $2::int[], $3::uuid[], $4::int[])
         ON CONFLICT (node_id, gpu_index) DO UPDATE
           SET job_id = EXCLUDED.job_id, rank = EXCLUDED.rank",
        &[&h_node, &h_gpu, &h_job, &h_rank],
    )
    .await?;
    // What may be scheduled changed (a spare joined, a node left), and
    // the fleet's shape with it.
    tx.execute(
        "UPDATE sched_state SET generation = generation + 1, fleet_version = fleet_version + 1
         WHERE id = 1",
        &[],
    )
    .await?;
    metrics::counter!("gangway_spare_swaps_total", "domain" => domain.to_string()).increment(1);
    let jobs: Vec<Uuid> = gangs.iter().map(|(j, _)| *j).collect();
    node_event(
        tx,
        failed,
        "spare",
        &format!("swapped out for spare {spare_id} (same {domain}); out for repair: {why}"),
        json!({"spare": spare_id, "domain": domain, "jobs": jobs}),
    )
    .await?;
    node_event(
        tx,
        &spare_id,
        "spare",
        &format!(
            "swapped in for {failed} (same {domain}): out of the spare pool, held for its gangs"
        ),
        json!({"failed": failed, "domain": domain, "jobs": jobs}),
    )
    .await?;
    for job in &jobs {
        insert_event(
            tx,
            *job,
            "spare_swap",
            &format!(
                "node {failed} failed ({why}): spare {spare_id} (same {domain}) takes its place; \
                 the gang restarts from its checkpoint on its other nodes and the spare"
            ),
            json!({"failed": failed, "spare": spare_id, "domain": domain}),
        )
        .await?;
    }
    // A gang whose workers were all on the failed node is already requeued.
    for job in &jobs {
        let queued: bool = tx
            .query_one(
                "SELECT state = 'queued' FROM jobs WHERE job_id = $1",
                &[job],
            )
            .await?
            .get(0);
        if queued {
            place_held(tx, *job).await?;
        }
    }
    Ok(Some(spare_id))
}

/// A spare found for a node: its id, and the tightest level it shares
/// with the node it is near (`leaf`, `spine` or `region`).
#[derive(Clone, Debug)]
pub(super) struct Spare {
    pub node_id: String,
    pub domain: String,
}

/// The nearest healthy, idle spare of `gpu_type` inside `within` (from
/// the region down; empty: anywhere): in `near`'s leaf first, then its
/// spine, then by id; never `exclude`. One locked elsewhere (its agent
/// syncing) is passed over rather than waited for, and none on a rack
/// reporting thermal throttling.
///
/// With `feeds` (the GPU indices a moving gang takes on it): it must have
/// those usable and, in another rack than `near`'s, its rack's power
/// budget must feed them (within `near`'s rack, the draw only moves).
/// Without: every GPU of it usable (a whole node joining a cluster; its
/// GPUs draw nothing until the scheduler places work there, within the
/// budget).
pub(super) async fn find_spare(
    tx: &Transaction<'_>,
    gpu_type: &str,
    near: Option<(&str, &str)>,
    exclude: Option<&str>,
    within: &[String],
    feeds: Option<&[i32]>,
) -> Result<Option<Spare>> {
    let (spine, leaf) = near.unwrap_or(("", ""));
    let row = tx
        .query_opt(
            &format!(
                // The candidates first (spares of the type, a handful per
                // region, by the `nodes_spares` index), then their racks'
                // facts once per rack (`nodes_by_leaf`), not once per
                // candidate: milliseconds on 10,000 GPUs.
                "WITH cand AS (
                     SELECT n.node_id, n.leaf, n.spine, n.gpu_power_w
                     FROM nodes n
                     WHERE n.spare AND n.gpu_type = $1 AND n.node_id IS DISTINCT FROM $5
                       AND n.operator_state = 'active' AND n.observed = 'healthy'
                       AND CASE WHEN $4::int[] IS NULL
                                THEN cardinality(n.usable) = (SELECT count(*) FROM gpus g
                                                              WHERE g.node_id = n.node_id)
                                ELSE n.usable @> $4::int[] END
                       AND NOT EXISTS (SELECT 1 FROM allocations x
                                       WHERE x.node_id = n.node_id AND x.released_at IS NULL)
                       AND NOT EXISTS (SELECT 1 FROM gpu_holds h JOIN jobs j USING (job_id)
                                       WHERE h.node_id = n.node_id AND j.state = 'preempting')
                       AND {}
                 ),
                 rack AS (
                     SELECT r.leaf, bool_or(r.rack_throttled) AS throttled,
                            min(r.rack_power_budget_w) AS budget,
                            (SELECT coalesce(sum(d.gpu_power_w), 0) FROM allocations a
                             JOIN nodes d ON d.node_id = a.node_id
                             WHERE d.leaf = r.leaf AND a.released_at IS NULL) AS draw
                     FROM nodes r WHERE r.leaf IN (SELECT leaf FROM cand)
                     GROUP BY r.leaf
                 )
                 SELECT n.node_id, n.leaf = $2 AS same_leaf, n.spine = $3 AS same_spine
                 FROM nodes n JOIN cand c USING (node_id) JOIN rack ON rack.leaf = c.leaf
                 WHERE NOT rack.throttled
                   AND ($4::int[] IS NULL OR c.leaf = $2 OR c.gpu_power_w IS NULL
                        OR rack.budget IS NULL
                        OR rack.budget >= rack.draw + cardinality($4::int[]) * c.gpu_power_w::bigint)
                 ORDER BY (n.leaf = $2) DESC, (n.spine = $3) DESC, n.node_id
                 LIMIT 1
                 FOR UPDATE OF n SKIP LOCKED",
                super::clusters::in_domain(6)
            ),
            &[&gpu_type, &leaf, &spine, &feeds, &exclude, &within],
        )
        .await?;
    Ok(row.map(|r| Spare {
        node_id: r.get(0),
        domain: match (r.get::<_, bool>(1), r.get::<_, bool>(2)) {
            (true, _) => "leaf",
            (false, true) => "spine",
            _ => "region",
        }
        .to_string(),
    }))
}

/// A requeued gang with held GPUs is placed onto them now, through the
/// planner's commit path. Returns whether it was placed; holds that no
/// longer fit are dropped (the gang waits at the front of its queue).
/// The caller holds the job's row lock.
pub(super) async fn place_held(tx: &Transaction<'_>, job: Uuid) -> Result<bool> {
    // A job being handed to another region is placed nowhere here: its
    // held GPUs go back.
    let leaving = tx
        .query_opt(
            "SELECT 1 FROM jobs WHERE job_id = $1 AND handover_to IS NOT NULL",
            &[&job],
        )
        .await?;
    if leaving.is_some() {
        tx.execute("DELETE FROM gpu_holds WHERE job_id = $1", &[&job])
            .await?;
        return Ok(false);
    }
    let rows = tx
        .query(
            "DELETE FROM gpu_holds WHERE job_id = $1 RETURNING rank, node_id, gpu_index",
            &[&job],
        )
        .await?;
    if rows.is_empty() {
        return Ok(false);
    }
    let mut ranks: BTreeMap<i32, (String, Vec<u32>)> = BTreeMap::new();
    for r in &rows {
        let e = ranks
            .entry(r.get(0))
            .or_insert_with(|| (r.get::<_, String>(1), Vec::new()));
        e.1.push(r.get::<_, i32>(2) as u32);
    }
    for (_, gpus) in ranks.values_mut() {
        gpus.sort_unstable();
    }
    let nodes: Vec<String> = ranks
        .values()
        .map(|(n, _)| n.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let (h_node, h_gpu): (Vec<String>, Vec<i32>) = rows
        .iter()
        .map(|r| (r.get::<_, String>(1), r.get::<_, i32>(2)))
        .unzip();
    let node_rows = tx
        .query(
            "SELECT node_id, spine, leaf, nvlink_domain, usable,
                    operator_state = 'active' AND NOT spare AS open
             FROM nodes WHERE node_id = ANY($1)",
            &[&nodes],
        )
        .await?;
    let taken: i64 = tx
        .query_one(
            "SELECT count(*) FROM allocations a
             JOIN unnest($1::text[], $2::int[]) AS x(n, g) ON a.node_id = x.n AND a.gpu_index = x.g
             WHERE a.released_at IS NULL",
            &[&h_node, &h_gpu],
        )
        .await?
        .get(0);
    let rank_ids: Vec<i32> = ranks.keys().copied().collect();
    let pending: i64 = tx
        .query_one(
            "SELECT count(*) FROM workers WHERE job_id = $1 AND rank = ANY($2) AND state = 'pending'",
            &[&job, &rank_ids],
        )
        .await?
        .get(0);
    let state: String = tx
        .query_one("SELECT state::text FROM jobs WHERE job_id = $1", &[&job])
        .await?
        .get(0);
    let mut place: BTreeMap<String, (String, String, String)> = BTreeMap::new();
    let mut unfit = None;
    for r in &node_rows {
        let id: String = r.get(0);
        let usable: Vec<i32> = r.get(4);
        let open: bool = r.get(5);
        let fits = ranks
            .values()
            .filter(|(n, _)| *n == id)
            .all(|(_, g)| g.iter().all(|x| usable.contains(&(*x as i32))));
        if !open || !fits {
            unfit = Some(format!("node {id} is no longer usable"));
        }
        place.insert(id, (r.get(1), r.get(2), r.get(3)));
    }
    if place.len() != nodes.len() {
        unfit = Some("a held node is gone".into());
    }
    if taken > 0 {
        unfit = Some(format!("{taken} held GPU(s) are taken"));
    }
    if pending != rank_ids.len() as i64 || state != "queued" {
        unfit = Some("the gang is not waiting as expected".into());
    }
    if let Some(why) = unfit {
        insert_event(
            tx,
            job,
            "spare_swap",
            &format!(
                "the spare swap cannot be placed ({why}): the gang waits at the front of its queue"
            ),
            json!({"abandoned": why}),
        )
        .await?;
        return Ok(false);
    }
    let level = Level::holding(
        (place.values())
            .map(|(spine, leaf, nvlink)| (spine.as_str(), leaf.as_str(), nvlink.as_str())),
    );
    let generation: i64 = tx
        .query_one("SELECT generation FROM sched_state WHERE id = 1", &[])
        .await?
        .get(0);
    let plan = Plan {
        generation,
        placements: vec![Placement {
            job: job.to_string(),
            ranks: ranks.keys().map(|&r| r as u32).collect(),
            level,
            workers: ranks
                .iter()
                .map(|(&rank, (node, gpus))| WorkerPlacement {
                    rank: rank as u32,
                    node: node.clone(),
                    gpus: gpus.clone(),
                })
                .collect(),
        }],
        ..Plan::default()
    };
    super::apply::apply_placements(tx, &plan).await?;
    metrics::counter!("gangway_placements_total", "level" => level.as_str()).increment(1);
    Ok(true)
}

/// A node an operator returns from repair after it was swapped out joins
/// the spare pool. Returns whether it did.
pub(super) async fn refill(tx: &Transaction<'_>, node_id: &str) -> Result<bool> {
    let n = tx
        .execute(
            "UPDATE nodes SET spare = true, refill_spare = false
             WHERE node_id = $1 AND refill_spare",
            &[&node_id],
        )
        .await?;
    if n > 0 {
        node_event(
            tx,
            node_id,
            "spare",
            "repaired: back in the spare pool",
            json!({}),
        )
        .await?;
        tx.execute(
            "UPDATE sched_state SET generation = generation + 1 WHERE id = 1",
            &[],
        )
        .await?;
    }
    Ok(n > 0)
}
