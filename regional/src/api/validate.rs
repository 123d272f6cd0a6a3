//! Job spec validation: everything a bad spec can get wrong is caught here,
//! before anything is stored. The fleet-free checks live in
//! `gangway_shared::validate`; this adds the ones that need the fleet.

use std::collections::BTreeMap;

use gangway_shared::api::{JobMode, JobSpec, TopologyLevel};
use gangway_shared::error::codes;
use gangway_shared::validate::invalid;
pub use gangway_shared::validate::{check_spec, Invalid};

use crate::store::FleetShape;

/// Checks that the job could ever run on this region's fleet (all of its
/// non-spare nodes of the type, free or not).
pub fn check_fits(spec: &JobSpec, fleet: &[FleetShape]) -> Result<(), Invalid> {
    if fleet.is_empty() {
        return Err(invalid(
            codes::UNKNOWN_GPU_TYPE,
            format!(
                "this region has no GPUs of type {:?}; GET /v1/region lists the types it has",
                spec.gpu_type
            ),
        ));
    }
    let per = spec.gpus_per_worker() as u32;
    let workers = spec.workers() as u64;
    let largest_node = fleet.iter().map(|n| n.gpus).max().unwrap_or(0);
    if per > largest_node {
        return Err(invalid(
            codes::EXCEEDS_REGION_CAPACITY,
            format!(
                "a worker needs {per} GPUs on one node, but the largest {} node has {largest_node}",
                spec.gpu_type
            ),
        ));
    }
    if spec.mode == JobMode::Array {
        return Ok(()); // workers run one by one as capacity allows
    }
    // Workers each domain could hold if it were empty, per level: what its
    // nodes hold, and no more in a rack than its power budget feeds.
    let mut per_domain: [BTreeMap<&str, u64>; 3] = Default::default();
    let mut rack_cap: BTreeMap<&str, u64> = BTreeMap::new();
    let mut spine_of: BTreeMap<&str, &str> = BTreeMap::new();
    for n in fleet {
        let w = (n.gpus / per) as u64;
        *per_domain[0].entry(&n.nvlink_domain).or_default() += w;
        *per_domain[1].entry(&n.leaf).or_default() += w;
        spine_of.insert(&n.leaf, &n.spine);
        if let Some(g) = n.rack_power_gpus {
            rack_cap.insert(&n.leaf, g / u64::from(per));
        }
    }
    let rack_of: BTreeMap<&str, &str> = (fleet.iter())
        .map(|n| (n.nvlink_domain.as_str(), n.leaf.as_str()))
        .collect();
    let mut power_binds = false;
    let mut capped = |w: &mut u64, leaf: &str| {
        if let Some(&cap) = rack_cap.get(leaf) {
            if cap < *w {
                *w = cap;
                power_binds = true;
            }
        }
    };
    for (leaf, w) in per_domain[1].iter_mut() {
        capped(w, leaf);
    }
    for (dom, w) in per_domain[0].iter_mut() {
        capped(w, rack_of[dom]);
    }
    let mut total = 0u64;
    let [_, leaves, spines] = &mut per_domain;
    for (leaf, &w) in leaves.iter() {
        *spines.entry(spine_of[leaf]).or_default() += w;
        total += w;
    }
    let power_note = if power_binds {
        " (counting what the racks' power budgets can feed)"
    } else {
        ""
    };
    if workers > total {
        return Err(invalid(
            codes::EXCEEDS_REGION_CAPACITY,
            format!(
                "the job needs {} {} GPUs ({workers} workers of {per}), more than this region could ever hold ({} workers{power_note})",
                spec.gpus, spec.gpu_type, total
            ),
        ));
    }
    let required = spec.topology.required();
    let idx = match required {
        TopologyLevel::Nvlink => Some(0),
        TopologyLevel::Leaf => Some(1),
        TopologyLevel::Spine => Some(2),
        TopologyLevel::Region => None,
    };
    if let Some(i) = idx {
        let best = per_domain[i].values().copied().max().unwrap_or(0);
        if workers > best {
            return Err(invalid(
                codes::UNSATISFIABLE_TOPOLOGY,
                format!(
                    "the job requires one {required} domain for {workers} workers of {per} GPUs, \
                     but the largest {required} domain here holds {best}{power_note}; relax \
                     topology.required"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gangway_shared::api::TopologySpec;

    fn spec(gpus: i64) -> JobSpec {
        JobSpec {
            name: "t".into(),
            gpus,
            gpu_type: "h100".into(),
            priority: Default::default(),
            estimated_duration_s: 60,
            max_duration_s: None,
            command: vec!["true".into()],
            env: Default::default(),
            gpus_per_worker: None,
            mode: JobMode::Gang,
            min_gpus: None,
            topology: TopologySpec::default(),
            region: None,
            reservation: None,
            cluster: None,
        }
    }

    fn fleet() -> Vec<FleetShape> {
        // 2 leaves × 2 nodes × 8 GPUs in one spine.
        (0..4)
            .map(|i| FleetShape {
                spine: "s0".into(),
                leaf: format!("l{}", i / 2),
                nvlink_domain: format!("n{i}"),
                gpus: 8,
                rack_power_gpus: None,
            })
            .collect()
    }

    #[test]
    fn a_racks_power_budget_bounds_what_it_could_ever_hold() {
        // Leaf l0's budget feeds 12 GPUs, l1's 20 (more than its 16).
        let fleet: Vec<FleetShape> = (fleet().into_iter())
            .map(|mut n| {
                n.rack_power_gpus = Some(if n.leaf == "l0" { 12 } else { 20 });
                n
            })
            .collect();
        let mut s = spec(16);
        s.topology.required = Some(TopologyLevel::Leaf);
        assert!(check_fits(&s, &fleet).is_ok()); // on l1
        s.gpus = 8;
        assert!(check_fits(&s, &fleet).is_ok());
        // 12 + 16 workers of 1 GPU in the spine, not 32.
        let whole = spec(29);
        let e = check_fits(&whole, &fleet).unwrap_err();
        assert_eq!(e.code, codes::EXCEEDS_REGION_CAPACITY);
        assert!(e.message.contains("power budgets"), "{}", e.message);
        assert!(check_fits(&spec(28), &fleet).is_ok());
        // Two 8-GPU workers in one leaf: only l1 (l0 feeds one).
        let mut gang = spec(16);
        gang.gpus_per_worker = Some(8);
        gang.topology.required = Some(TopologyLevel::Leaf);
        assert!(check_fits(&gang, &fleet).is_ok());
        let only_l0: Vec<FleetShape> = fleet.iter().filter(|n| n.leaf == "l0").cloned().collect();
        let e = check_fits(&gang, &only_l0).unwrap_err();
        assert_eq!(e.code, codes::EXCEEDS_REGION_CAPACITY);
        // Across both leaves a 3-worker gang fits (1 + 2), not in one leaf.
        let mut wide = spec(24);
        wide.gpus_per_worker = Some(8);
        assert!(check_fits(&wide, &fleet).is_ok());
        wide.topology.required = Some(TopologyLevel::Leaf);
        let e = check_fits(&wide, &fleet).unwrap_err();
        assert_eq!(e.code, codes::UNSATISFIABLE_TOPOLOGY);
        assert!(e.message.contains("holds 2"), "{}", e.message);
        // An NVLink domain is bounded by its rack too: 12 on l0 feeds one
        // 8-GPU worker per node, not two nodes' worth.
        let mut per_node = spec(8);
        per_node.topology.required = Some(TopologyLevel::Nvlink);
        assert!(check_fits(&per_node, &only_l0).is_ok());
    }

    #[test]
    fn fits_checks_type_size_and_topology() {
        assert_eq!(
            check_fits(&spec(8), &[]).unwrap_err().code,
            codes::UNKNOWN_GPU_TYPE
        );
        assert!(check_fits(&spec(32), &fleet()).is_ok());
        assert_eq!(
            check_fits(&spec(33), &fleet()).unwrap_err().code,
            codes::EXCEEDS_REGION_CAPACITY
        );
        let mut s = spec(24);
        s.topology.required = Some(TopologyLevel::Leaf);
        assert_eq!(
            check_fits(&s, &fleet()).unwrap_err().code,
            codes::UNSATISFIABLE_TOPOLOGY
        );
        s.gpus = 16;
        assert!(check_fits(&s, &fleet()).is_ok());
        let mut big_worker = spec(16);
        big_worker.gpus_per_worker = Some(16);
        assert_eq!(
            check_fits(&big_worker, &fleet()).unwrap_err().code,
            codes::EXCEEDS_REGION_CAPACITY
        );
    }
}
