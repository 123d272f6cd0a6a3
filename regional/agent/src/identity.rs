//! Who a real machine is: its name (hostname, or `--node-name`), the GPUs
//! it actually has, and the claimant id that tells a restart of this agent
//! apart from a second agent claiming the same node.
//!
//! GPUs come from NVML (loaded at run time) when a driver is present:
//! index, UUID, model, memory and PCI bus id, enumerated in PCI bus order,
//! which is the order CUDA uses under `CUDA_DEVICE_ORDER=PCI_BUS_ID` (set
//! for every worker). On a machine without one (a GPU-less test host) they
//! are declared instead (`--gpus N --gpu-type T`); a real machine never
//! falls back to a simulated fleet.

use std::path::Path;

use gangway_shared::agent::{AgentGpu, AgentNode};
use gangway_shared::fleet::valid_node_name;

/// Where the kernel keeps this machine's name.
const KERNEL_HOSTNAME: &str = "/proc/sys/kernel/hostname";

/// Why a real machine's node cannot be described.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot tell this machine's name ({0}): pass --node-name")]
    NoHostname(String),
    #[error("node name {0:?} must be 1-200 letters, digits, '.', '_' or '-' (pass --node-name)")]
    BadName(String),
    #[error(
        "no GPUs: NVML does not load here ({0}) and none are declared; on a machine without an \
         NVIDIA driver (a test host) declare them with --gpus N --gpu-type TYPE"
    )]
    NoGpus(String),
    #[error("--gpus is declared without --gpu-type (or the reverse): pass both")]
    HalfDeclared,
    #[error("GPU type {0:?} must be lowercase letters, digits and '-' (e.g. h100)")]
    BadGpuType(String),
    #[error("--gpus must be between 1 and {max}, not {got}", max = gangway_shared::fleet::MAX_GPUS_PER_NODE)]
    GpuCount { got: u32 },
}

/// GPUs declared for a machine whose GPUs NVML cannot see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub gpus: Option<u32>,
    pub gpu_type: Option<String>,
}

/// This machine's name: its hostname, lowercased (hostnames compare
/// without case; inventories are written in lowercase).
pub fn hostname() -> Result<String, IdentityError> {
    let name = std::fs::read_to_string(KERNEL_HOSTNAME)
        .map_err(|e| IdentityError::NoHostname(e.to_string()))?;
    let name = name.trim().to_ascii_lowercase();
    if name.is_empty() {
        return Err(IdentityError::NoHostname("it is empty".into()));
    }
    Ok(name)
}

/// A GPU type from an NVML model name: `NVIDIA H100 80GB HBM3` → `h100`,
/// `NVIDIA A100-SXM4-80GB` → `a100`, `NVIDIA GB200` → `gb200`.
pub fn gpu_type_of_model(model: &str) -> String {
    let lower = model.trim().to_ascii_lowercase();
    let rest = ["nvidia ", "tesla "]
        .iter()
        .fold(lower.as_str(), |s, p| s.strip_prefix(p).unwrap_or(s));
    rest.split([' ', '-', '_'])
        .find(|w| !w.is_empty())
        .unwrap_or("gpu")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

/// The GPUs NVML sees, in its index order (PCI bus order), or why not.
pub fn nvml_gpus() -> Result<Vec<AgentGpu>, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| e.to_string())?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count {
        let d = nvml
            .device_by_index(index)
            .map_err(|e| format!("GPU {index}: {e}"))?;
        out.push(AgentGpu {
            index,
            uuid: d.uuid().map_err(|e| format!("GPU {index}'s UUID: {e}"))?,
            model: d.name().ok(),
            memory_mib: d.memory_info().ok().map(|m| m.total / (1024 * 1024)),
            pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
        });
    }
    Ok(out)
}

/// The one node a real agent serves: `name`, reached at `address`, with
/// `found` GPUs (NVML's, or why it has none) or else the declared ones.
/// NVML's GPUs win over a declared count (a warning says so); the GPU type
/// is the declared one, else the first GPU's model's.
pub fn real_node(
    name: &str,
    address: &str,
    found: Result<Vec<AgentGpu>, String>,
    declared: &Declared,
) -> Result<AgentNode, IdentityError> {
    if !valid_node_name(name) {
        return Err(IdentityError::BadName(name.to_string()));
    }
    if let Some(t) = &declared.gpu_type {
        let ok = !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(IdentityError::BadGpuType(t.clone()));
        }
    }
    let (gpus, gpu_type) = match found {
        Ok(gpus) if !gpus.is_empty() => {
            if declared.gpus.is_some_and(|n| n as usize != gpus.len()) {
                tracing::warn!(
                    declared = declared.gpus,
                    found = gpus.len(),
                    "NVML finds another number of GPUs than declared: registering what NVML finds"
                );
            }
            let ty = declared
                .gpu_type
                .clone()
                .unwrap_or_else(|| gpu_type_of_model(gpus[0].model.as_deref().unwrap_or("gpu")));
            (gpus, ty)
        }
        found => {
            let why = found.err().unwrap_or_else(|| "NVML finds no GPU".into());
            let (n, ty) = match (declared.gpus, &declared.gpu_type) {
                (Some(n), Some(t)) => (n, t.clone()),
                (None, None) => return Err(IdentityError::NoGpus(why)),
                _ => return Err(IdentityError::HalfDeclared),
            };
            if !(1..=gangway_shared::fleet::MAX_GPUS_PER_NODE).contains(&n) {
                return Err(IdentityError::GpuCount { got: n });
            }
            let gpus = (0..n)
                .map(|index| AgentGpu {
                    index,
                    uuid: format!("GPU-declared-{name}-{index}"),
                    ..AgentGpu::default()
                })
                .collect();
            (gpus, ty)
        }
    };
    Ok(AgentNode {
        node_id: name.to_string(),
        // The region's inventory says where the machine sits.
        spine: String::new(),
        leaf: String::new(),
        nvlink_domain: String::new(),
        spare: false,
        gpu_type,
        address: address.to_string(),
        gpus,
        gpu_power_w: None,
        rack_power_budget_w: None,
    })
}

/// Who claims the agent's nodes: the same for every start of this agent
/// on this machine (its `/etc/machine-id` and its work directory), and
/// different for a second agent elsewhere or beside it. Opaque to the
/// region.
pub fn host_id(work_dir: &Path) -> String {
    let machine = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| hostname().ok())
        .unwrap_or_default();
    let dir = std::path::absolute(work_dir).unwrap_or_else(|_| work_dir.to_path_buf());
    let name = format!("{machine}\0{}", dir.display());
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_types_from_nvml_model_names() {
        for (model, ty) in [
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
            ("NVIDIA GB200", "gb200"),
            ("Tesla V100-SXM2-16GB", "v100"),
            ("NVIDIA L40S", "l40s"),
        ] {
            assert_eq!(gpu_type_of_model(model), ty, "{model}");
        }
    }

    #[test]
    fn declared_gpus_where_nvml_finds_none() {
        let declared = Declared {
            gpus: Some(4),
            gpu_type: Some("h100".into()),
        };
        let n = real_node("gpu-a1-001", "10.0.0.7", Err("no driver".into()), &declared).unwrap();
        assert_eq!(n.node_id, "gpu-a1-001");
        assert_eq!(n.gpu_type, "h100");
        assert_eq!(n.gpus.len(), 4);
        assert_eq!(n.gpus[3].uuid, "GPU-declared-gpu-a1-001-3");
        // Nothing declared: refused, saying what to do.
        let none = Declared {
            gpus: None,
            gpu_type: None,
        };
        let e = real_node("gpu-a1-001", "a", Err("no driver".into()), &none).unwrap_err();
        assert!(e.to_string().contains("--gpus N --gpu-type"), "{e}");
        assert!(matches!(
            real_node("bad name", "a", Err(String::new()), &declared),
            Err(IdentityError::BadName(_))
        ));
    }

    #[test]
    fn nvml_gpus_win_and_name_the_type() {
        let found = vec![AgentGpu {
            index: 0,
            uuid: "GPU-1234".into(),
            model: Some("NVIDIA H100 80GB HBM3".into()),
            memory_mib: Some(81_559),
            pci_bus_id: Some("00000000:18:00.0".into()),
        }];
        let declared = Declared {
            gpus: Some(8),
            gpu_type: None,
        };
        let n = real_node("m", "a", Ok(found.clone()), &declared).unwrap();
        assert_eq!((n.gpus, n.gpu_type.as_str()), (found, "h100"));
    }

    #[test]
    fn one_claimant_per_machine_and_work_dir() {
        let a = host_id(Path::new("/var/lib/gangway/agent"));
        assert_eq!(a, host_id(Path::new("/var/lib/gangway/agent")));
        assert_ne!(a, host_id(Path::new("/var/lib/gangway/agent-2")));
    }
}
