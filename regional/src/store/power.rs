//! Rack power budgets as the scheduler's snapshot reads them: each rack's
//! whole-rack draw against its budget, and the share of the headroom each
//! scheduling pool (a GPU type's shared pool, or a dedicated cluster) may
//! add to (docs/architecture.md). The core only ever sees the free GPUs a
//! rack's remaining share can feed (`gangway_sched`'s `power.rs`).

use std::collections::BTreeMap;

use super::Result;

/// One rack's power, whole-rack (every GPU type in it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RackPower {
    /// The rack's budget for GPU draw: the smallest its nodes report.
    pub budget_w: u64,
    /// What its live allocations and held GPUs draw, at their types'
    /// draws (GPUs of a type with no known draw count nothing).
    pub allocated_w: u64,
}

impl RackPower {
    /// Watts placements may still add to the rack (negative: over budget,
    /// as after a budget was lowered under running work).
    pub fn headroom_w(&self) -> i64 {
        self.budget_w as i64 - self.allocated_w as i64
    }
}

/// Per (rack, GPU type, scheduling partition: the type's shared pool or a
/// dedicated cluster, `clusters::pool_key`) of the racks with a budget,
/// over every type: the rack's budget, the partition's GPUs there (spares
/// included) and how many of
/// them are taken (live allocations, and GPUs held for a gang moving onto
/// a spare while it is being preempted, as the snapshot's `live` read),
/// and the type's draw (the most any of its nodes reports). Only types
/// with a known draw count.
pub(super) const RACK_POWER_SQL: &str = "
    WITH draw AS (
        SELECT gpu_type, max(gpu_power_w)::bigint AS draw_w FROM nodes
        WHERE gpu_power_w IS NOT NULL GROUP BY gpu_type
    ), budget AS (
        SELECT leaf, min(rack_power_budget_w) AS budget_w FROM nodes
        WHERE rack_power_budget_w IS NOT NULL GROUP BY leaf
    ), taken AS (
        SELECT node_id, gpu_index FROM allocations WHERE released_at IS NULL
        UNION
        SELECT h.node_id, h.gpu_index FROM gpu_holds h
        JOIN jobs j ON j.job_id = h.job_id AND j.state = 'preempting'
    )
    SELECT n.leaf, n.gpu_type, b.budget_w, d.draw_w,
           pool_of(n.gpu_type, n.cluster_id) AS pool,
           count(*)::bigint AS gpus, count(t.node_id)::bigint AS taken
    FROM nodes n
    JOIN budget b ON b.leaf = n.leaf
    JOIN draw d ON d.gpu_type = n.gpu_type
    JOIN gpus g ON g.node_id = n.node_id
    LEFT JOIN taken t ON t.node_id = g.node_id AND t.gpu_index = g.gpu_index
    GROUP BY n.leaf, n.gpu_type, pool, b.budget_w, d.draw_w
    ORDER BY n.leaf, pool";

/// [`RACK_POWER_SQL`]'s rows.
pub(super) async fn rack_power_rows<C: tokio_postgres::GenericClient + Sync>(
    client: &C,
) -> Result<Vec<RackTypePower>> {
    Ok(rack_power_of(&client.query(RACK_POWER_SQL, &[]).await?))
}

/// [`RACK_POWER_SQL`]'s rows, as read (the snapshot prepares it).
pub(super) fn rack_power_of(rows: &[tokio_postgres::Row]) -> Vec<RackTypePower> {
    let n = |r: &tokio_postgres::Row, c: &str| r.get::<_, i64>(c).max(0) as u64;
    rows.iter()
        .map(|r| RackTypePower {
            leaf: r.get("leaf"),
            gpu_type: r.get("gpu_type"),
            pool: r.get("pool"),
            budget_w: n(r, "budget_w"),
            draw_w: n(r, "draw_w"),
            gpus: n(r, "gpus"),
            taken: n(r, "taken"),
        })
        .collect()
}

/// Per (rack, partition), how many more GPUs of its type its headroom
/// ([`rack_power`]) can feed.
pub(super) fn gpus_fed(rows: &[RackTypePower]) -> BTreeMap<(String, String), u64> {
    let (_, headroom) = rack_power(rows);
    (rows.iter())
        .filter(|r| r.draw_w > 0)
        .map(|r| {
            let key = (r.leaf.clone(), r.pool.clone());
            let watts = headroom.get(&key).copied().unwrap_or(0);
            (key, watts / r.draw_w)
        })
        .collect()
}

/// One row of [`RACK_POWER_SQL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RackTypePower {
    pub(super) leaf: String,
    pub(super) gpu_type: String,
    /// The scheduling partition: `gpu_type`'s shared pool, or a cluster.
    pub(super) pool: String,
    pub(super) budget_w: u64,
    pub(super) draw_w: u64,
    pub(super) gpus: u64,
    pub(super) taken: u64,
}

/// Each rack's whole-rack power, and each (rack, partition)'s headroom:
/// the watts this pass's placements of the partition may add there.
///
/// A rack of one type gets all of it: budget − what its GPUs draw. Where
/// types share a rack, each type's partition is planned and committed on
/// its own, against its own version, so one type's headroom must not
/// depend on what another type's concurrent commits may still add. Each
/// type therefore owns a fixed share of the *budget*, in proportion to its
/// GPUs in the rack (rounded down), and may add at most that share less
/// what its own GPUs draw, and never more than the whole rack's headroom.
/// A type's own draw is protected by its partition version (a plan for it
/// read at an older one is rejected), so however the types' passes
/// interleave, each stays within its share and together they stay within
/// the budget. (Splitting the rack's *remaining* headroom instead would
/// not: a type whose passes commit several times while another type's
/// plan is in flight could take more than its fraction of what the other
/// one read.) A dedicated cluster's nodes are a partition of their own,
/// so they own a share the same way next to their type's shared pool.
pub(super) fn rack_power(
    rows: &[RackTypePower],
) -> (BTreeMap<String, RackPower>, BTreeMap<(String, String), u64>) {
    let mut racks: BTreeMap<String, (RackPower, u64)> = BTreeMap::new();
    for r in rows {
        let (rack, gpus) = racks.entry(r.leaf.clone()).or_default();
        rack.budget_w = r.budget_w;
        rack.allocated_w = rack.allocated_w.saturating_add(r.taken * r.draw_w);
        *gpus += r.gpus;
    }
    let mut headroom = BTreeMap::new();
    for r in rows {
        let (rack, gpus) = racks[&r.leaf];
        let whole = rack.budget_w.saturating_sub(rack.allocated_w);
        let share = if gpus == 0 {
            0
        } else {
            (u128::from(rack.budget_w) * u128::from(r.gpus) / u128::from(gpus)) as u64
        };
        let own = r.taken.saturating_mul(r.draw_w);
        headroom.insert(
            (r.leaf.clone(), r.pool.clone()),
            share.saturating_sub(own).min(whole),
        );
    }
    let racks = racks.into_iter().map(|(k, (p, _))| (k, p)).collect();
    (racks, headroom)
}

#[cfg(test)]
mod power_tests {
    use super::*;

    fn row(leaf: &str, ty: &str, budget: u64, draw: u64, gpus: u64, taken: u64) -> RackTypePower {
        RackTypePower {
            leaf: leaf.into(),
            gpu_type: ty.into(),
            pool: ty.into(),
            budget_w: budget,
            draw_w: draw,
            gpus,
            taken,
        }
    }

    #[test]
    fn one_type_gets_the_whole_racks_headroom() {
        let (racks, room) = rack_power(&[row("l0", "h100", 14_000, 700, 32, 8)]);
        assert_eq!(
            racks["l0"],
            RackPower {
                budget_w: 14_000,
                allocated_w: 5_600
            }
        );
        assert_eq!(racks["l0"].headroom_w(), 8_400);
        assert_eq!(room[&("l0".into(), "h100".into())], 8_400);
        // Over budget (lowered under running work): no room, shown negative.
        let (racks, room) = rack_power(&[row("l0", "h100", 4_000, 700, 32, 8)]);
        assert_eq!(racks["l0"].headroom_w(), -1_600);
        assert_eq!(room[&("l0".into(), "h100".into())], 0);
    }

    #[test]
    fn shared_racks_split_the_budget_by_gpus() {
        // 16 h100 (700 W) and 16 a100 (400 W) under 12 kW: 6 kW each.
        let rows = [
            row("l0", "a100", 12_000, 400, 16, 0),
            row("l0", "h100", 12_000, 700, 16, 4),
        ];
        let (racks, room) = rack_power(&rows);
        assert_eq!(racks["l0"].allocated_w, 2_800);
        assert_eq!(room[&("l0".into(), "h100".into())], 6_000 - 2_800);
        assert_eq!(room[&("l0".into(), "a100".into())], 6_000);
        // A type over its share (the budget was lowered) takes nothing and
        // the other never more than the whole rack's headroom.
        let rows = [
            row("l0", "a100", 8_000, 400, 16, 0),
            row("l0", "h100", 8_000, 700, 16, 8),
        ];
        let (_, room) = rack_power(&rows);
        assert_eq!(room[&("l0".into(), "h100".into())], 0);
        assert_eq!(room[&("l0".into(), "a100".into())], 8_000 - 5_600);
    }
}
