//! What the agent tells the region about its nodes' health: the machine's
//! boot id with every sync, and the health signals seen since the last sync
//! the region accepted.
//!
//! On a real machine the signals come from NVML (`nvml-wrapper`), loaded at
//! run time: where `Nvml::init()` fails (no driver, no GPU: CI, laptops,
//! the simulated fleet) the agent logs it once and reports none. A poller on
//! a blocking thread waits for XID events between polls of ECC counters,
//! row-remap state, temperature and thermal throttling, and NVLink error
//! counters, and reports a counter or a state only when it changed (the
//! region's policy reads them as totals since boot, so a repeat would say
//! nothing new). XID events are events: each one is reported.
//!
//! A simulated fleet reports no signals; faults are injected into it
//! through the region's admin API instead.
//!
//! NVML sees GPUs, not racks: it has nothing to say about a rack's
//! thermal state ([`Signal::RackThermal`]). That comes from the facility
//! (the rack's BMC or a DCIM/Redfish feed of its inlet temperatures and
//! CDU state); such a feed would push `Signal::RackThermal` into the
//! agent's [`Signals`], like the poller below, and every sync carries it.
//! Until one is wired in, real racks report none and drills inject it
//! (`rack_thermal` faults).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_health::Signal;
use tokio_util::sync::CancellationToken;

/// Where the kernel keeps the id of the current boot.
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Signals not yet accepted by the region, oldest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct Signals(Arc<Mutex<Vec<Signal>>>);

/// Most signals kept while the region is away; the oldest go first (the
/// counters are totals, so a later one says what an earlier one did).
const MAX_PENDING: usize = 10_000;

impl Signals {
    pub fn push(&self, s: Signal) {
        let kind = match &s {
            Signal::Xid { .. } => "xid",
            Signal::Ecc { .. } => "ecc",
            Signal::Remap { .. } => "remap",
            Signal::Thermal { .. } => "thermal",
            Signal::Nvlink { .. } => "nvlink",
            Signal::Heartbeat { .. } => "heartbeat",
            Signal::NodeDown => "node_down",
            Signal::RackThermal { .. } => "rack_thermal",
        };
        metrics::counter!("gangway_agent_health_signals_total", "kind" => kind).increment(1);
        let mut v = self.0.lock().expect("signals lock");
        if v.len() >= MAX_PENDING {
            v.remove(0);
        }
        v.push(s);
    }

    /// What to send now; [`Signals::accepted`] drops it once the region has
    /// it, so a failed sync sends it again.
    pub fn pending(&self) -> Vec<Signal> {
        self.0.lock().expect("signals lock").clone()
    }

    /// The region accepted the first `n` signals.
    pub fn accepted(&self, n: usize) {
        let mut v = self.0.lock().expect("signals lock");
        let n = n.min(v.len());
        v.drain(..n);
    }
}

/// The machine boot id to report: the configured one, else the kernel's
/// for real machines, else `fallback` (the agent's own boot id: a new one
/// each start, as a simulated fleet reboots when its agent restarts).
pub(crate) fn machine_boot_id(configured: Option<&str>, real: bool, fallback: &str) -> String {
    if let Some(b) = configured.filter(|b| !b.is_empty()) {
        return b.to_string();
    }
    if real {
        if let Ok(b) = std::fs::read_to_string(KERNEL_BOOT_ID) {
            let b = b.trim();
            if !b.is_empty() {
                return b.to_string();
            }
        }
    }
    fallback.to_string()
}

/// Starts the NVML poller on a blocking thread, if NVML loads; returns
/// whether it did.
pub(crate) fn spawn_nvml(
    signals: Signals,
    interval: Duration,
    shutdown: CancellationToken,
) -> bool {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            tracing::info!(error = %e, "no NVML here: reporting no GPU health signals");
            return false;
        }
    };
    tracing::info!("NVML loaded: reporting GPU health signals");
    std::thread::Builder::new()
        .name("gangway-nvml".into())
        .spawn(move || nvml_loop(&nvml, &signals, interval, &shutdown))
        .map(|_| true)
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot start the NVML poller");
            false
        })
}

/// Watts one GPU of this machine draws at most: the highest enforced power
/// limit among its GPUs (NVML reports milliwatts), or `None` where NVML
/// does not load or reports none. Registered as the node's draw, so rack
/// power budgets count what the machine is really capped at (an operator's
/// `nvidia-smi -pl` included), not the fleet file's nominal figure.
pub(crate) fn nvml_gpu_power_w() -> Option<u32> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let count = nvml.device_count().ok()?;
    let most_mw = (0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .filter_map(|d| d.enforced_power_limit().ok())
        .max()?;
    // Round up: a budget must never count less than the cap.
    Some(most_mw.div_ceil(1000)).filter(|&w| w > 0)
}

/// What was last reported per GPU, so only changes are sent.
#[derive(Default)]
struct Last {
    ecc: BTreeMap<u32, (u64, u64)>,
    remap: BTreeMap<u32, (bool, bool)>,
    thermal: BTreeMap<u32, (bool, u32)>,
    nvlink: BTreeMap<u32, u64>,
}

fn nvml_loop(
    nvml: &nvml_wrapper::Nvml,
    signals: &Signals,
    interval: Duration,
    shutdown: &CancellationToken,
) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let count = nvml.device_count().unwrap_or(0);
    // XID events: one set for every GPU that supports them.
    let mut events = nvml.create_event_set().ok();
    for i in 0..count {
        let (Some(set), Ok(device)) = (events.take(), nvml.device_by_index(i)) else {
            continue;
        };
        events = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::warn!(gpu = i, error = %e, "cannot watch XID events; polling only");
                nvml.create_event_set().ok()
            }
        };
    }
    let mut last = Last::default();
    let mut next_poll = Instant::now();
    while !shutdown.is_cancelled() {
        if Instant::now() >= next_poll {
            poll(nvml, count, signals, &mut last);
            next_poll = Instant::now() + interval;
        }
        let wait = next_poll
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(1));
        match &events {
            Some(set) => match set.wait(wait.as_millis() as u32) {
                Ok(e) => {
                    if let (Some(nvml_wrapper::enums::event::XidError::Value(code)), Ok(gpu)) =
                        (e.event_data, e.device.index())
                    {
                        tracing::warn!(gpu, xid = code, "XID event");
                        signals.push(Signal::Xid {
                            gpu,
                            code: code as u32,
                        });
                    }
                }
                Err(nvml_wrapper::error::NvmlError::Timeout) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "XID wait failed");
                    std::thread::sleep(wait);
                }
            },
            None => std::thread::sleep(wait),
        }
    }
}

/// One poll of every GPU's counters and states; reports what changed.
fn poll(nvml: &nvml_wrapper::Nvml, count: u32, signals: &Signals, last: &mut Last) {
    use nvml_wrapper::bitmasks::device::ThrottleReasons;
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
    use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
    for gpu in 0..count {
        let Ok(device) = nvml.device_by_index(gpu) else {
            continue;
        };
        // ECC counts since the driver loaded.
        let single = device
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .ok();
        let double = device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok();
        if let (Some(single_bit), Some(double_bit)) = (single, double) {
            if last.ecc.insert(gpu, (single_bit, double_bit)) != Some((single_bit, double_bit)) {
                signals.push(Signal::Ecc {
                    gpu,
                    single_bit,
                    double_bit,
                });
            }
        }
        // Row remapping (Ampere and later), else page retirement.
        if let Some((pending, failed)) = remap_state(nvml, &device) {
            if last.remap.insert(gpu, (pending, failed)) != Some((pending, failed)) {
                signals.push(Signal::Remap {
                    gpu,
                    pending,
                    failed,
                });
            }
        }
        // Temperature and thermal throttling.
        if let Ok(celsius) = device.temperature(TemperatureSensor::Gpu) {
            let throttled = device.current_throttle_reasons().is_ok_and(|r| {
                r.intersects(
                    ThrottleReasons::HW_THERMAL_SLOWDOWN | ThrottleReasons::SW_THERMAL_SLOWDOWN,
                )
            });
            // Report a change of throttling, or of temperature by 5 °C.
            let changed = match last.thermal.get(&gpu) {
                None => true,
                Some(&(t, c)) => t != throttled || c.abs_diff(celsius) >= 5,
            };
            if changed {
                last.thermal.insert(gpu, (throttled, celsius));
                signals.push(Signal::Thermal {
                    gpu,
                    celsius,
                    throttled,
                });
            }
        }
        // NVLink errors since boot, summed over the GPU's links.
        let mut errors = 0u64;
        let mut any = false;
        for link in 0..18 {
            let l = device.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            for counter in [
                ErrorCounter::DlReplay,
                ErrorCounter::DlRecovery,
                ErrorCounter::DlCrcFlit,
                ErrorCounter::DlCrcData,
            ] {
                if let Ok(n) = l.error_counter(counter) {
                    errors = errors.saturating_add(n);
                    any = true;
                }
            }
        }
        if any && last.nvlink.insert(gpu, errors) != Some(errors) {
            signals.push(Signal::Nvlink { gpu, errors });
        }
    }
}

/// (pending, failed) row remaps, through `nvmlDeviceGetRemappedRows` (not
/// wrapped by nvml-wrapper), else pending page retirement on older GPUs.
fn remap_state(
    nvml: &nvml_wrapper::Nvml,
    device: &nvml_wrapper::Device<'_>,
) -> Option<(bool, bool)> {
    if let Ok(sym) = nvml.lib().nvmlDeviceGetRemappedRows.as_ref() {
        let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: the device handle is live while `device` is; the four
        // out-pointers point at locals that outlive the call.
        let rc = unsafe {
            sym(
                device.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failed,
            )
        };
        if rc == 0 {
            return Some((pending != 0, failed != 0));
        }
    }
    device
        .are_pages_pending_retired()
        .ok()
        .map(|pending| (pending, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_kept_until_the_region_accepts_them() {
        let s = Signals::default();
        s.push(Signal::Xid { gpu: 0, code: 79 });
        s.push(Signal::Xid { gpu: 1, code: 13 });
        let sent = s.pending();
        assert_eq!(sent.len(), 2);
        // A failed sync: the same ones go again, with what came since.
        s.push(Signal::NodeDown);
        assert_eq!(s.pending().len(), 3);
        // Accepted: only what came since remains.
        s.accepted(sent.len());
        assert_eq!(s.pending(), vec![Signal::NodeDown]);
    }

    #[test]
    fn the_boot_id_is_configured_or_the_kernels_or_the_agents() {
        assert_eq!(machine_boot_id(Some("b-1"), true, "agent"), "b-1");
        assert_eq!(machine_boot_id(None, false, "agent"), "agent");
        let real = machine_boot_id(None, true, "agent");
        match std::fs::read_to_string(KERNEL_BOOT_ID) {
            Ok(k) => assert_eq!(real, k.trim()),
            Err(_) => assert_eq!(real, "agent"),
        }
    }

    #[test]
    fn without_a_driver_there_is_no_power_limit() {
        // Where a driver exists the limit is a GPU's plausible draw.
        match nvml_wrapper::Nvml::init() {
            Err(_) => assert_eq!(nvml_gpu_power_w(), None),
            Ok(_) => assert!(nvml_gpu_power_w().is_none_or(|w| (1..=5_000).contains(&w))),
        }
    }

    #[test]
    fn without_a_driver_nvml_reports_nothing_and_does_not_fail() {
        // CI machines have no NVIDIA driver: init fails and the agent goes
        // on without GPU health signals. Where a driver exists, the poller
        // starts; either way nothing panics.
        let stop = CancellationToken::new();
        let _started = spawn_nvml(Signals::default(), Duration::from_secs(10), stop.clone());
        stop.cancel();
    }
}
