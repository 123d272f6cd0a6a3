//! Job spec validation: everything a bad spec can get wrong is caught here,
//! before anything is stored.

use std::collections::BTreeMap;

use gangway_shared::api::{
    JobMode, JobSpec, TopologyLevel, MAX_ARGS, MAX_DURATION_S, MAX_GPUS_PER_WORKER, MAX_JOB_GPUS,
    MAX_NAME_LEN,
};
use gangway_shared::error::codes;

use crate::store::FleetShape;

/// Why a spec was refused: a stable code and a message saying what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub code: &'static str,
    pub message: String,
}

fn invalid(code: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        code,
        message: message.into(),
    }
}

/// Checks what can be checked without knowing the fleet.
pub fn check_spec(spec: &JobSpec) -> Result<(), Invalid> {
    let name_ok = !spec.name.trim().is_empty()
        && spec.name.chars().count() <= MAX_NAME_LEN
        && !spec.name.chars().any(char::is_control);
    if !name_ok {
        return Err(invalid(
            codes::INVALID_SPEC,
            format!("name must be 1–{MAX_NAME_LEN} printable characters"),
        ));
    }
    if spec.gpus < 1 || spec.gpus > MAX_JOB_GPUS {
        return Err(invalid(
            codes::INVALID_GPUS,
            format!(
                "gpus must be between 1 and {MAX_JOB_GPUS}, got {}",
                spec.gpus
            ),
        ));
    }
    let per = spec.gpus_per_worker();
    if !(1..=MAX_GPUS_PER_WORKER).contains(&per) {
        return Err(invalid(
            codes::INVALID_GPUS,
            format!("gpus_per_worker must be between 1 and {MAX_GPUS_PER_WORKER}, got {per}"),
        ));
    }
    if spec.gpus % per != 0 {
        return Err(invalid(
            codes::INVALID_GPUS,
            format!(
                "gpus ({}) must be a multiple of gpus_per_worker ({per})",
                spec.gpus
            ),
        ));
    }
    let type_ok = !spec.gpu_type.is_empty()
        && spec.gpu_type.len() <= 64
        && spec
            .gpu_type
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !type_ok {
        return Err(invalid(
            codes::INVALID_SPEC,
            "gpu_type must be 1–64 characters of a-z, 0-9 and '-' (for example \"h100\")",
        ));
    }
    if !(1..=MAX_DURATION_S).contains(&spec.estimated_duration_s) {
        return Err(invalid(
            codes::INVALID_SPEC,
            format!("estimated_duration_s must be between 1 and {MAX_DURATION_S} seconds"),
        ));
    }
    if let Some(max) = spec.max_duration_s {
        if !(1..=MAX_DURATION_S).contains(&max) {
            return Err(invalid(
                codes::INVALID_SPEC,
                format!("max_duration_s must be between 1 and {MAX_DURATION_S} seconds"),
            ));
        }
    }
    if spec.command.is_empty() || spec.command[0].is_empty() {
        return Err(invalid(
            codes::INVALID_SPEC,
            "command must be a non-empty argv list, for example [\"python\", \"train.py\"]",
        ));
    }
    if spec.command.len() > MAX_ARGS || spec.command.iter().any(|a| a.contains('\0')) {
        return Err(invalid(
            codes::INVALID_SPEC,
            format!("command must have at most {MAX_ARGS} arguments without NUL bytes"),
        ));
    }
    if spec.env.len() > MAX_ARGS {
        return Err(invalid(
            codes::INVALID_SPEC,
            format!("env must have at most {MAX_ARGS} entries"),
        ));
    }
    for (k, v) in &spec.env {
        let key_ok = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !key_ok || v.contains('\0') {
            return Err(invalid(
                codes::INVALID_SPEC,
                format!("env entry {k:?} is not a valid variable (names: [A-Za-z_][A-Za-z0-9_]*)"),
            ));
        }
        if k.starts_with("GANGWAY_") || RESERVED_ENV.contains(&k.as_str()) {
            return Err(invalid(
                codes::INVALID_SPEC,
                format!("env variable {k} is set by Gangway and cannot be overridden"),
            ));
        }
    }
    Ok(())
}

/// Variables the agent sets for every worker.
const RESERVED_ENV: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
];

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
            topology: TopologySpec::default(),
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
    fn counts_out_of_range_are_invalid_gpus() {
        for g in [0, -1, MAX_JOB_GPUS + 1] {
            assert_eq!(check_spec(&spec(g)).unwrap_err().code, codes::INVALID_GPUS);
        }
        let mut s = spec(12);
        s.gpus_per_worker = Some(8);
        assert_eq!(check_spec(&s).unwrap_err().code, codes::INVALID_GPUS);
    }

    #[test]
    fn reserved_env_is_refused() {
        let mut s = spec(1);
        s.env.insert("RANK".into(), "3".into());
        assert_eq!(check_spec(&s).unwrap_err().code, codes::INVALID_SPEC);
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
