//! Spec checks that need no fleet: the global tier runs them before it
//! touches any region, and regions run them again.

use crate::api::{
    JobMode, JobSpec, MAX_ARGS, MAX_DURATION_S, MAX_GPUS_PER_WORKER, MAX_JOB_GPUS, MAX_NAME_LEN,
};
use crate::error::codes;

/// Why a spec was refused: a stable code and a message saying what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub code: &'static str,
    pub message: String,
}

pub fn invalid(code: &'static str, message: impl Into<String>) -> Invalid {
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
    if let Some(min) = spec.min_gpus {
        if spec.mode != JobMode::Gang {
            return Err(invalid(
                codes::INVALID_MIN_GPUS,
                "min_gpus makes a gang elastic; an array job already starts worker by worker \
                 (drop min_gpus, or use \"mode\": \"gang\")",
            ));
        }
        if min < 1 || min > spec.gpus || min % per != 0 {
            return Err(invalid(
                codes::INVALID_MIN_GPUS,
                format!(
                    "min_gpus must be a multiple of gpus_per_worker ({per}) between {per} and \
                     gpus ({}), got {min}",
                    spec.gpus
                ),
            ));
        }
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
const RESERVED_ENV: [&str; 7] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: i64) -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": "t", "gpus": gpus, "gpu_type": "h100",
            "estimated_duration_s": 60, "command": ["true"]
        }))
        .unwrap()
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
    fn min_gpus_must_be_a_whole_number_of_workers_within_the_gang() {
        let elastic = |gpus: i64, per: i64, min: i64| {
            let mut s = spec(gpus);
            s.gpus_per_worker = Some(per);
            s.min_gpus = Some(min);
            s
        };
        for ok in [elastic(32, 8, 8), elastic(32, 8, 32), elastic(4, 1, 1)] {
            assert_eq!(check_spec(&ok), Ok(()), "{ok:?}");
            assert!(ok.min_workers().unwrap() >= 1);
        }
        assert_eq!(elastic(32, 8, 16).min_workers(), Some(2));
        assert_eq!(spec(8).min_workers(), None);
        for bad in [
            elastic(32, 8, 0),
            elastic(32, 8, -8),
            elastic(32, 8, 4),
            elastic(32, 8, 12),
            elastic(32, 8, 40),
        ] {
            assert_eq!(
                check_spec(&bad).unwrap_err().code,
                codes::INVALID_MIN_GPUS,
                "{bad:?}"
            );
        }
        let mut array = elastic(4, 1, 2);
        array.mode = JobMode::Array;
        assert_eq!(
            check_spec(&array).unwrap_err().code,
            codes::INVALID_MIN_GPUS
        );
        // An invalid gang size is reported as such first.
        assert_eq!(
            check_spec(&elastic(12, 8, 8)).unwrap_err().code,
            codes::INVALID_GPUS
        );
    }

    #[test]
    fn reserved_env_is_refused() {
        let mut s = spec(1);
        s.env.insert("RANK".into(), "3".into());
        assert_eq!(check_spec(&s).unwrap_err().code, codes::INVALID_SPEC);
    }
}
