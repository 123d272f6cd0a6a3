//! What a node agent observes and reports: GPU and node health signals.
//!
//! The vocabulary two crates share, kept below both: the agent protocol
//! (`gangway-shared`'s `agent::SyncRequest` carries signals) and the pure
//! health policy (`gangway-health`, which decides what each signal means
//! and re-exports [`Signal`]). No I/O, serde only.

use serde::{Deserialize, Serialize};

/// One observation an agent reports (through NVML on real machines, by
/// injection in a simulated fleet).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Signal {
    /// An XID event on a GPU.
    Xid { gpu: u32, code: u32 },
    /// ECC error counts since boot (volatile).
    Ecc {
        gpu: u32,
        single_bit: u64,
        double_bit: u64,
    },
    /// Row remapping (Ampere and later) or page retirement state.
    Remap {
        gpu: u32,
        pending: bool,
        failed: bool,
    },
    /// Temperature and whether the GPU reports thermal throttling.
    Thermal {
        gpu: u32,
        celsius: u32,
        throttled: bool,
    },
    /// NVLink error counters since boot, summed over the GPU's links.
    Nvlink { gpu: u32, errors: u64 },
    /// The agent checked in; `boot_id` changes when the machine reboots.
    Heartbeat { boot_id: String },
    /// The whole node is gone (power, board, or an injected death).
    NodeDown,
    /// The node's rack (its leaf), as the node's BMC sees the rack's
    /// sensors, is (or no longer is) thermally throttling. A rack-level
    /// fact: the health policy's `NodeHealth` ignores it (the node itself is fine); the
    /// region records it per node and keeps every node of a leaf with a
    /// throttling report from taking new work, running jobs staying, until
    /// a `throttled: false` report.
    RackThermal { throttled: bool },
}
