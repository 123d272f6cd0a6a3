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
    // Workers each domain could hold if it were empty, per level.
    let mut per_domain: [BTreeMap<&str, u64>; 3] = Default::default();
    let mut total = 0u64;
    for n in fleet {
        let w = (n.gpus / per) as u64;
        total += w;
        *per_domain[0].entry(&n.nvlink_domain).or_default() += w;
        *per_domain[1].entry(&n.leaf).or_default() += w;
        *per_domain[2].entry(&n.spine).or_default() += w;
    }
    if workers > total {
        return Err(invalid(
            codes::EXCEEDS_REGION_CAPACITY,
            format!(
                "the job needs {} {} GPUs ({workers} workers of {per}), more than this region could ever hold ({} workers)",
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
                     but the largest {required} domain here holds {best}; relax topology.required"
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
            })
            .collect()
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
