//! What the leader's tick carries through for clusters
//! ([`Store::tend_clusters`]): degraded clusters healed from spares, nodes
//! given back released once idle, deleted clusters finished; and a
//! member's failure (`member_failed`, from the node-health path in
//! `nodes.rs`), which swaps a spare of the cluster's domain in.

use super::*;

impl Store {
    /// Carries clusters' changes through, the leader's beat: degraded
    /// clusters get free spares of their domains; nodes given back whose
    /// jobs are off leave; jobs still on them are asked (again) to
    /// checkpoint and stop; deleted clusters' queued jobs are cancelled and,
    /// once nothing of theirs runs, their nodes unbound.
    pub async fn tend_clusters(&self) -> Result<TendOutcome> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_membership(&tx, false).await?;
        let mut out = TendOutcome::default();
        // Nodes being given back: their jobs asked to move, again if need be.
        let busy = tx
            .query(
                "SELECT n.node_id, n.cluster_id FROM nodes n JOIN clusters c USING (cluster_id)
                 WHERE (n.cluster_release OR c.state = 'deleting')
                   AND EXISTS (SELECT 1 FROM allocations a
                               WHERE a.node_id = n.node_id AND a.released_at IS NULL)
                 ORDER BY n.node_id",
                &[],
            )
            .await?;
        for r in &busy {
            let (node, id): (String, Uuid) = (r.get(0), r.get(1));
            out.evacuated +=
                evacuate_member(&tx, &node, &format!("cluster {id} gives the node back")).await?;
        }
        let resizing: Vec<Uuid> = (tx
            .query(
                "SELECT DISTINCT cluster_id FROM nodes WHERE cluster_release ORDER BY 1",
                &[],
            )
            .await?)
            .iter()
            .map(|r| r.get(0))
            .collect();
        for id in resizing {
            out.released += release_idle(&tx, id).await?;
        }
        let (cancelled, released, deleted) = finish_deletes(&tx, None).await?;
        out.cancelled += cancelled;
        out.released += released;
        out.deleted += deleted;
        // Degraded clusters: spares of their domains, nearest their nodes.
        let short = tx
            .query(
                "SELECT c.cluster_id, c.gpu_type, c.path,
                        c.nodes - (SELECT count(*) FROM nodes n
                                   WHERE n.cluster_id = c.cluster_id AND NOT n.cluster_release)
                            AS missing
                 FROM clusters c WHERE c.state = 'active'
                   AND c.nodes > (SELECT count(*) FROM nodes n
                                  WHERE n.cluster_id = c.cluster_id AND NOT n.cluster_release)
                 ORDER BY c.created_at, c.cluster_id",
                &[],
            )
            .await?;
        for r in &short {
            let (id, gpu_type, path, missing): (Uuid, String, Vec<String>, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            for _ in 0..missing {
                let members = member_places(&tx, id).await?;
                let near = members.first().map(|m| m.0.clone());
                let Some(spare) = crate::store::spares::find_spare(
                    &tx,
                    &gpu_type,
                    near.as_ref().map(|c| (c.spine.as_str(), c.leaf.as_str())),
                    None,
                    &path,
                    None,
                )
                .await?
                else {
                    break;
                };
                join_as_spare(&tx, id, &spare.node_id).await?;
                cluster_event(
                    &tx,
                    id,
                    "spare_swapped",
                    &format!(
                        "spare {} (same {}) joined: the cluster is back to {} of its nodes",
                        spare.node_id,
                        spare.domain,
                        members.iter().filter(|m| !m.2).count() + 1
                    ),
                    json!({"spare": spare.node_id, "domain": spare.domain}),
                )
                .await?;
                out.healed += 1;
            }
        }
        if out.healed + out.released + out.deleted > 0 {
            bump_fleet(&tx).await?;
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// A spare leaves the pool and joins `cluster`.
pub(super) async fn join_as_spare(tx: &Transaction<'_>, cluster: Uuid, spare: &str) -> Result<()> {
    tx.execute(
        "UPDATE nodes SET spare = false, spare_managed = true, cluster_id = $2,
                cluster_release = false
         WHERE node_id = $1",
        &[&spare, &cluster],
    )
    .await?;
    Ok(())
}

/// Nodes `cluster` gives back with nothing allocated or held on them
/// leave it; returns how many.
pub(super) async fn release_idle(tx: &Transaction<'_>, cluster: Uuid) -> Result<usize> {
    let rows = tx
        .query(
            "UPDATE nodes n SET cluster_id = NULL, cluster_release = false
             WHERE n.cluster_id = $1 AND n.cluster_release
               AND NOT EXISTS (SELECT 1 FROM allocations a
                               WHERE a.node_id = n.node_id AND a.released_at IS NULL)
               AND NOT EXISTS (SELECT 1 FROM gpu_holds h WHERE h.node_id = n.node_id)
             RETURNING n.node_id",
            &[&cluster],
        )
        .await?;
    for r in &rows {
        let node: String = r.get(0);
        cluster_event(
            tx,
            cluster,
            "node_released",
            &format!("node {node} given back to the region"),
            json!({"node": node}),
        )
        .await?;
    }
    if !rows.is_empty() {
        bump_fleet(tx).await?;
    }
    Ok(rows.len())
}

/// Deleted clusters (`only`, or all): queued jobs cancelled; once none of
/// their jobs is unfinished and nothing is allocated on their nodes, the
/// nodes are unbound and the cluster is gone. Returns (jobs cancelled,
/// nodes released, clusters deleted).
pub(super) async fn finish_deletes(
    tx: &Transaction<'_>,
    only: Option<Uuid>,
) -> Result<(usize, usize, usize)> {
    let ids: Vec<Uuid> = (tx
        .query(
            "SELECT cluster_id FROM clusters
             WHERE state = 'deleting' AND ($1::uuid IS NULL OR cluster_id = $1)
             ORDER BY cluster_id",
            &[&only],
        )
        .await?)
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (mut cancelled, mut released, mut deleted) = (0, 0, 0);
    for id in ids {
        let queued: Vec<Uuid> = (tx
            .query(
                "SELECT job_id FROM jobs WHERE cluster_id = $1 AND state = 'queued'
                 ORDER BY job_id",
                &[&id],
            )
            .await?)
            .iter()
            .map(|r| r.get(0))
            .collect();
        crate::store::jobs::lock_jobs(tx, &queued).await?;
        for job in &queued {
            crate::store::jobs::cancel_in_tx(tx, *job, &format!("cluster {id} was deleted"))
                .await?;
            cancelled += 1;
        }
        let busy: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE cluster_id = $1
                                AND state NOT IN ('succeeded', 'failed', 'cancelled'))
                     OR EXISTS (SELECT 1 FROM allocations a JOIN nodes n USING (node_id)
                                WHERE n.cluster_id = $1 AND a.released_at IS NULL)",
                &[&id],
            )
            .await?
            .get(0);
        if busy {
            continue;
        }
        let n = tx
            .execute(
                "UPDATE nodes SET cluster_id = NULL, cluster_release = false WHERE cluster_id = $1",
                &[&id],
            )
            .await?;
        tx.execute(
            "UPDATE clusters SET state = 'deleted' WHERE cluster_id = $1",
            &[&id],
        )
        .await?;
        cluster_event(
            tx,
            id,
            "deleted",
            &format!("deleted: its {n} node(s) are back in the region"),
            json!({"released": n}),
        )
        .await?;
        bump_fleet(tx).await?;
        released += n as usize;
        deleted += 1;
    }
    Ok((cancelled, released, deleted))
}

/// The cluster a node belongs to, if any, with its domain.
pub(in crate::store) struct Membership {
    pub cluster: Uuid,
    pub path: Vec<String>,
}

pub(in crate::store) async fn membership(
    tx: &Transaction<'_>,
    node: &str,
) -> Result<Option<Membership>> {
    Ok(tx
        .query_opt(
            "SELECT c.cluster_id, c.path FROM nodes n JOIN clusters c USING (cluster_id)
             WHERE n.node_id = $1 AND c.state = 'active'",
            &[&node],
        )
        .await?
        .map(|r| Membership {
            cluster: r.get(0),
            path: r.get(1),
        }))
}

/// A member failed (`why`): it goes to repair and leaves the cluster, and
/// `swapped` (the spare the spare-swap path already took for its gangs,
/// inside the cluster's domain) or another free spare of the domain takes
/// its place; with none, the cluster is degraded until
/// [`Store::tend_clusters`] finds one. The caller holds the node's lock.
pub(in crate::store) async fn member_failed(
    tx: &Transaction<'_>,
    m: &Membership,
    failed: &str,
    why: &str,
    swapped: Option<String>,
) -> Result<()> {
    let place = tx
        .query_one(
            "SELECT spine, leaf, gpu_type, cluster_release FROM nodes WHERE node_id = $1",
            &[&failed],
        )
        .await?;
    let (spine, leaf, gpu_type): (String, String, String) =
        (place.get(0), place.get(1), place.get(2));
    // A node being given back is not replaced; a spare already taken for
    // its gangs joins only to be given back in turn once they move off.
    let releasing: bool = place.get(3);
    tx.execute(
        "UPDATE nodes SET operator_state = 'repair', admin_reason = $2, drain_wait = NULL,
                drain_deadline = NULL, spare_managed = true, refill_spare = true,
                cluster_id = NULL, cluster_release = false
         WHERE node_id = $1",
        &[&failed, &format!("failed in cluster {}: {why}", m.cluster)],
    )
    .await?;
    let spare = match swapped {
        Some(s) => {
            let domain: String = tx
                .query_one(
                    "SELECT CASE WHEN leaf = $2 AND spine = $3 THEN 'leaf'
                                 WHEN spine = $3 THEN 'spine' ELSE 'region' END
                     FROM nodes WHERE node_id = $1",
                    &[&s, &leaf, &spine],
                )
                .await?
                .get(0);
            Some(crate::store::spares::Spare { node_id: s, domain })
        }
        None if releasing => None,
        None => {
            crate::store::spares::find_spare(
                tx,
                &gpu_type,
                Some((spine.as_str(), leaf.as_str())),
                Some(failed),
                &m.path,
                None,
            )
            .await?
        }
    };
    cluster_event(
        tx,
        m.cluster,
        "node_failed",
        &format!("node {failed} failed ({why}): out of the cluster, sent to repair"),
        json!({"node": failed, "why": why}),
    )
    .await?;
    match spare {
        Some(s) if releasing => {
            join_as_spare(tx, m.cluster, &s.node_id).await?;
            tx.execute(
                "UPDATE nodes SET cluster_release = true WHERE node_id = $1",
                &[&s.node_id],
            )
            .await?;
            cluster_event(
                tx,
                m.cluster,
                "spare_swapped",
                &format!(
                    "spare {} (same {}) holds the gangs of {failed}, which was being given \
                     back; it is given back in turn once they move off",
                    s.node_id, s.domain
                ),
                json!({"node": failed, "spare": s.node_id, "domain": s.domain, "releasing": true}),
            )
            .await?;
        }
        None if releasing => {}
        Some(s) => {
            join_as_spare(tx, m.cluster, &s.node_id).await?;
            cluster_event(
                tx,
                m.cluster,
                "spare_swapped",
                &format!(
                    "spare {} (same {}) took the place of {failed}; its jobs restart there \
                     from their checkpoints",
                    s.node_id, s.domain
                ),
                json!({"node": failed, "spare": s.node_id, "domain": s.domain}),
            )
            .await?;
            metrics::counter!("gangway_cluster_heals_total", "outcome" => "spare").increment(1);
        }
        None => {
            cluster_event(
                tx,
                m.cluster,
                "no_spare",
                &format!(
                    "no free {gpu_type} spare in the cluster's domain {}: it runs with one node \
                     fewer until one is free (the region keeps looking)",
                    domain_name(&m.path)
                ),
                json!({"node": failed, "domain": m.path}),
            )
            .await?;
            metrics::counter!("gangway_cluster_heals_total", "outcome" => "no_spare").increment(1);
        }
    }
    bump_fleet(tx).await?;
    Ok(())
}
