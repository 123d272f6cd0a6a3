//! The fleet map's model: each node's state as one colour, nodes grouped
//! by spine and leaf as the fabric groups them, and on a large region
//! (more than [`DETAIL_LIMIT`] nodes) each leaf summed into one tile until
//! someone zooms into it, so a 10,000-GPU region's map is a few hundred
//! tiles, not thousands of nodes.

use std::collections::BTreeMap;

use gangway_shared::api::NodeView;

/// Most nodes drawn one by one on a region's map; above it, leaves.
pub const DETAIL_LIMIT: usize = 256;

/// What a node's colour says, most urgent first: a node both cordoned and
/// failed shows as failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shade {
    /// Lost, failed, or waiting for repair.
    Failed,
    /// Suspect, degraded or damped: its agent's reports say something is
    /// off.
    Suspect,
    /// Its rack reports thermal throttling, or it has throttled GPUs.
    Throttled,
    /// Cordoned by an operator: no new work.
    Cordoned,
    /// Draining, in maintenance or in repair (as operators asked).
    Draining,
    /// Held back as a spare and not running anything.
    Spare,
    /// Every GPU allocated.
    Full,
    /// Some GPUs allocated.
    Busy,
    /// Nothing allocated, takes work.
    Free,
}

impl Shade {
    pub const ALL: [Shade; 9] = [
        Shade::Free,
        Shade::Busy,
        Shade::Full,
        Shade::Spare,
        Shade::Cordoned,
        Shade::Draining,
        Shade::Throttled,
        Shade::Suspect,
        Shade::Failed,
    ];

    /// The CSS class that colours it (`assets/console.css`).
    pub fn class(self) -> &'static str {
        match self {
            Shade::Failed => "s-failed",
            Shade::Suspect => "s-suspect",
            Shade::Throttled => "s-throttled",
            Shade::Cordoned => "s-cordoned",
            Shade::Draining => "s-draining",
            Shade::Spare => "s-spare",
            Shade::Full => "s-full",
            Shade::Busy => "s-busy",
            Shade::Free => "s-free",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Shade::Failed => "failed",
            Shade::Suspect => "suspect",
            Shade::Throttled => "throttled",
            Shade::Cordoned => "cordoned",
            Shade::Draining => "draining",
            Shade::Spare => "spare",
            Shade::Full => "allocated",
            Shade::Busy => "partly allocated",
            Shade::Free => "free",
        }
    }
}

/// The one colour of a node.
pub fn shade(n: &NodeView) -> Shade {
    let throttled = n.rack_throttled
        || n.observed_detail
            .get("throttled_gpus")
            .and_then(|v| v.as_array())
            .is_some_and(|a| !a.is_empty());
    match (n.observed.as_str(), n.admin_state.as_str()) {
        ("lost" | "failed" | "needs_repair", _) => Shade::Failed,
        ("suspect" | "degraded" | "damped", _) => Shade::Suspect,
        _ if throttled => Shade::Throttled,
        (_, "cordoned") => Shade::Cordoned,
        (_, "draining" | "maintenance" | "repair") => Shade::Draining,
        _ if n.spare && n.allocated_gpus.is_empty() => Shade::Spare,
        _ if n.gpus > 0 && n.allocated_gpus.len() as u32 >= n.gpus => Shade::Full,
        _ if !n.allocated_gpus.is_empty() => Shade::Busy,
        _ => Shade::Free,
    }
}

/// One GPU's square on a node: allocated, free, or not usable (taken out
/// by health or by an operator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCell {
    pub class: &'static str,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeCell {
    pub id: String,
    pub shade: Shade,
    pub gpus: Vec<GpuCell>,
    /// Its tooltip: state, why, jobs.
    pub title: String,
    pub jobs: Vec<String>,
}

/// A piece of a leaf's stacked bar: the share of its nodes in one state.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub x: f64,
    pub width: f64,
    pub class: &'static str,
    pub title: String,
}

/// Width of a leaf tile's bar, in SVG units.
pub const BAR_WIDTH: f64 = 160.0;

/// A bar `width` wide split by `parts` — (count, CSS class, tooltip) — in
/// proportion to their counts out of `total`.
pub fn stacked(
    parts: impl Iterator<Item = (usize, &'static str, String)>,
    total: usize,
    width: f64,
) -> Vec<Segment> {
    let mut x = 0.0;
    parts
        .map(|(n, class, title)| {
            let w = width * n as f64 / total.max(1) as f64;
            let seg = Segment {
                x,
                width: w,
                class,
                title,
            };
            x += w;
            seg
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct LeafView {
    pub name: String,
    pub nodes: usize,
    pub gpus: u32,
    pub allocated: u32,
    /// Nodes per state, the states it has.
    pub counts: Vec<(Shade, usize)>,
    pub bar: Vec<Segment>,
    /// Its nodes one by one (empty when the map sums leaves).
    pub cells: Vec<NodeCell>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpineView {
    pub name: String,
    pub leaves: Vec<LeafView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FleetMap {
    pub spines: Vec<SpineView>,
    /// Leaves summed into tiles (a large region, not zoomed).
    pub aggregated: bool,
    /// Every state with its number of nodes (the legend).
    pub legend: Vec<(Shade, usize)>,
    pub nodes: usize,
    pub gpus: u32,
    pub allocated: u32,
}

fn cell(n: &NodeView) -> NodeCell {
    let s = shade(n);
    let gpus = (0..n.gpus)
        .map(|i| GpuCell {
            class: if n.allocated_gpus.contains(&i) {
                "g-alloc"
            } else if n.usable_gpus.contains(&i) {
                "g-free"
            } else {
                "g-out"
            },
        })
        .collect();
    let jobs: Vec<String> = n.jobs.iter().map(|j| j.to_string()).collect();
    let mut title = format!(
        "{} · {} · {}/{} GPUs allocated · {} {}",
        n.node_id,
        s.label(),
        n.allocated_gpus.len(),
        n.gpus,
        n.observed,
        n.admin_state
    );
    if let Some(why) = &n.why {
        title.push_str(&format!(" · {why}"));
    }
    if !jobs.is_empty() {
        title.push_str(&format!(" · jobs: {}", jobs.join(", ")));
    }
    NodeCell {
        id: n.node_id.clone(),
        shade: s,
        gpus,
        title,
        jobs,
    }
}

/// The map of `nodes`; `only_leaf` zooms into one leaf (its nodes one by
/// one, whatever the region's size).
pub fn map(nodes: &[NodeView], only_leaf: Option<&str>) -> FleetMap {
    let aggregated = only_leaf.is_none() && nodes.len() > DETAIL_LIMIT;
    let mut tree: BTreeMap<&str, BTreeMap<&str, Vec<&NodeView>>> = BTreeMap::new();
    for n in nodes {
        if only_leaf.is_some_and(|l| l != n.leaf) {
            continue;
        }
        (tree.entry(n.spine.as_str()).or_default())
            .entry(n.leaf.as_str())
            .or_default()
            .push(n);
    }
    let mut legend: BTreeMap<Shade, usize> = BTreeMap::new();
    let (mut total_nodes, mut gpus, mut allocated) = (0, 0, 0);
    let spines = tree
        .into_iter()
        .map(|(spine, leaves)| SpineView {
            name: spine.to_string(),
            leaves: leaves
                .into_iter()
                .map(|(leaf, mut members)| {
                    members.sort_by(|a, b| a.node_id.cmp(&b.node_id));
                    let mut counts: BTreeMap<Shade, usize> = BTreeMap::new();
                    let (mut g, mut a) = (0, 0);
                    for n in &members {
                        *counts.entry(shade(n)).or_default() += 1;
                        g += n.gpus;
                        a += n.allocated_gpus.len() as u32;
                    }
                    for (s, c) in &counts {
                        *legend.entry(*s).or_default() += c;
                    }
                    total_nodes += members.len();
                    gpus += g;
                    allocated += a;
                    let bar = stacked(
                        Shade::ALL.iter().filter_map(|s| {
                            let c = *counts.get(s)?;
                            Some((c, s.class(), format!("{c} {}", s.label())))
                        }),
                        members.len(),
                        BAR_WIDTH,
                    );
                    LeafView {
                        name: leaf.to_string(),
                        nodes: members.len(),
                        gpus: g,
                        allocated: a,
                        counts: counts.into_iter().collect(),
                        bar,
                        cells: if aggregated {
                            Vec::new()
                        } else {
                            members.iter().map(|n| cell(n)).collect()
                        },
                    }
                })
                .collect(),
        })
        .collect();
    FleetMap {
        spines,
        aggregated,
        legend: Shade::ALL
            .iter()
            .map(|s| (*s, legend.get(s).copied().unwrap_or(0)))
            .collect(),
        nodes: total_nodes,
        gpus,
        allocated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, leaf: &str, allocated: &[u32]) -> NodeView {
        serde_json::from_value(serde_json::json!({
            "node_id": id, "region": "r1", "agent_id": "a", "executor": "sim",
            "spine": "s0", "leaf": leaf, "nvlink_domain": id, "gpu_type": "h100",
            "spare": false, "gpus": 8, "admin_state": "active", "observed": "healthy",
            "observed_detail": {}, "schedulable": true,
            "usable_gpus": (0..8).collect::<Vec<u32>>(), "allocated_gpus": allocated,
            "jobs": [], "drained": false,
        }))
        .unwrap()
    }

    #[test]
    fn a_nodes_colour_is_its_most_urgent_state() {
        let mut n = node("n1", "l0", &[]);
        assert_eq!(shade(&n), Shade::Free);
        n.allocated_gpus = vec![0, 1];
        assert_eq!(shade(&n), Shade::Busy);
        n.allocated_gpus = (0..8).collect();
        assert_eq!(shade(&n), Shade::Full);
        n.admin_state = "cordoned".into();
        assert_eq!(shade(&n), Shade::Cordoned);
        n.admin_state = "draining".into();
        assert_eq!(shade(&n), Shade::Draining);
        n.rack_throttled = true;
        assert_eq!(shade(&n), Shade::Throttled);
        n.observed = "lost".into();
        assert_eq!(shade(&n), Shade::Failed);
    }

    #[test]
    fn a_large_region_sums_its_leaves_until_one_is_zoomed_into() {
        let nodes: Vec<NodeView> = (0..300)
            .map(|i| node(&format!("n{i:03}"), &format!("l{}", i / 20), &[0]))
            .collect();
        let m = map(&nodes, None);
        assert!(m.aggregated);
        let leaves: usize = m.spines.iter().map(|s| s.leaves.len()).sum();
        assert_eq!(leaves, 15);
        assert!(m.spines[0].leaves.iter().all(|l| l.cells.is_empty()));
        assert_eq!(m.nodes, 300);
        assert_eq!(m.allocated, 300);
        // Each leaf's bar spans the whole tile.
        let bar: f64 = m.spines[0].leaves[0].bar.iter().map(|s| s.width).sum();
        assert!((bar - BAR_WIDTH).abs() < 1e-9);

        let zoomed = map(&nodes, Some("l3"));
        assert!(!zoomed.aggregated);
        assert_eq!(zoomed.nodes, 20);
        assert_eq!(zoomed.spines[0].leaves[0].cells.len(), 20);
        assert_eq!(zoomed.spines[0].leaves[0].cells[0].gpus[0].class, "g-alloc");
        assert_eq!(zoomed.spines[0].leaves[0].cells[0].gpus[1].class, "g-free");
    }
}
