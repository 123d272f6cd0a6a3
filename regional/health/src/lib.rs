//! Gangway's node-health policy: what agents observe about GPUs and nodes
//! ([`Signal`]) turned into actions ([`Action`]) and a node's observed
//! state ([`Observed`]), combined with what operators asked ([`Admin`]) in
//! one place, [`decide`], that says whether a node may take work.
//!
//! Pure like the scheduler core: no I/O, no clock (time comes in as
//! seconds), so the regional service, the simulator and tests share it.
//!
//! # The rules ([`HealthPolicy`], defaults from NVIDIA's XID guidance)
//! - **Application XIDs** (13 graphics engine exception, 31 memory page
//!   fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video
//!   decoder exception) are the job's fault: recorded, never held against
//!   the GPU or the node.
//! - **GPU faults** (48 double-bit ECC, 63 row-remap/page-retirement
//!   pending, 64 remap/retirement failure, 92 high single-bit ECC rate, 94
//!   contained ECC error) quarantine that GPU: it takes no new work; jobs
//!   on it are asked to checkpoint and move. A reset (a reboot: a new boot
//!   id) returns it, except after a remap failure (64, or a reported failed
//!   remap), which sends the node out for repair.
//! - **Node faults** (74 NVLink error, 79 GPU fallen off the bus, 95
//!   uncontained ECC error, 119/120 GSP errors; NVLink error counters
//!   rising past a threshold) cordon and drain the node until it reboots
//!   and reports healthy.
//! - Unknown XIDs are recorded and treated as [`HealthPolicy::unknown_xid`]
//!   (default: quarantine the GPU, the safe side).
//! - **Thermal**: a GPU at or above the temperature limit, or reporting
//!   thermal throttling, takes no new work until it recovers. A *rack*
//!   reporting thermal throttling ([`Signal::RackThermal`]) is the
//!   region's concern, not the node's: no node of that leaf takes new work
//!   until it recovers (the node's own state here is unchanged).
//! - **Heartbeats**: an agent silent for `suspect_after_s` makes its node
//!   suspect (no new work); for `lost_after_s`, lost (its jobs count as
//!   failed and restart elsewhere from their checkpoints).
//! - **Mass silence is not mass failure**: when many nodes fall silent at
//!   once ([`HealthPolicy::mass_silence_percent`] of the region, and at
//!   least [`HealthPolicy::mass_silence_min_nodes`]), the likelier cause is
//!   the control plane or the network, not hundreds of machines: the
//!   silent nodes stay suspect (no new work, their jobs keep running) and
//!   none is declared lost until the silence is no longer massive. Outside
//!   such an event, at most [`HealthPolicy::silent_losses_per_tick`] newly
//!   silent nodes (or 1 % of the region, if more) are declared lost per
//!   tick, the rest on the next ones ([`HealthPolicy::silence_verdict`]) —
//!   as Kubernetes' node lifecycle controller stops or slows evictions
//!   when a whole zone looks unhealthy.
//! - **Flapping is damped**: a node that turned bad `flap_limit` times
//!   within `flap_window_s` stays out for `hold_down_s` after it last
//!   recovered.
//! - **Repair**: a node with `repair_after` node-level failures within
//!   `repair_window_s`, or a failed row remap, goes out for repair and
//!   stays out until an operator returns it.

pub mod maintenance;

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What the policy does about a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Recorded only.
    Ignore,
    /// No new work on this GPU until it recovers (thermal).
    Throttle,
    /// The GPU takes no new work; work on it checkpoints and moves.
    QuarantineGpu,
    /// The node takes no new work and its jobs checkpoint and move.
    DrainNode,
    /// The node goes out for repair.
    Repair,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ignore => "ignore",
            Action::Throttle => "throttle",
            Action::QuarantineGpu => "quarantine_gpu",
            Action::DrainNode => "drain_node",
            Action::Repair => "repair",
        }
    }
}

pub use gangway_signals::Signal;

/// The policy, from configuration. Every field has a default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthPolicy {
    /// XIDs caused by applications: never penalise the GPU or node.
    pub application_xids: Vec<u32>,
    /// XIDs that quarantine the GPU until a reset.
    pub gpu_xids: Vec<u32>,
    /// XIDs that cordon and drain the node until it reboots healthy.
    pub node_xids: Vec<u32>,
    /// XIDs after which the GPU can only be repaired (remap failure).
    pub repair_xids: Vec<u32>,
    /// What an XID in none of the lists does.
    pub unknown_xid: Action,
    /// Single-bit ECC errors since boot at which the GPU is quarantined.
    pub single_bit_limit: u64,
    /// NVLink errors since boot at which the node is drained.
    pub nvlink_error_limit: u64,
    /// Temperature (°C) at which a GPU takes no new work.
    pub temperature_limit_c: u32,
    /// Silence after which a node is suspect, then lost (seconds).
    pub suspect_after_s: u64,
    pub lost_after_s: u64,
    /// Flap damping: this many turns to bad within the window keep the
    /// node out for the hold-down after it last recovered.
    pub flap_limit: u32,
    pub flap_window_s: u64,
    pub hold_down_s: u64,
    /// This many node-level failures within the window send it to repair.
    pub repair_after: u32,
    pub repair_window_s: u64,
    /// Silence this widespread (percent of the region's nodes, and at
    /// least `mass_silence_min_nodes` of them) is taken for a control-plane
    /// or network fault: no silent node is declared lost while it lasts.
    pub mass_silence_percent: u32,
    pub mass_silence_min_nodes: u32,
    /// Outside a mass silence, nodes newly silent past `lost_after_s`
    /// declared lost per tick at most (or 1 % of the region, if more).
    pub silent_losses_per_tick: u32,
}

/// What a tick may do about nodes silent past the lost limit
/// ([`HealthPolicy::silence_verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SilenceVerdict {
    /// Silence is not widespread: this many may be declared lost now.
    Lose { at_most: usize },
    /// Mass silence: none is declared lost; they stay suspect.
    Hold,
}

impl Default for HealthPolicy {
    fn default() -> HealthPolicy {
        HealthPolicy {
            application_xids: vec![13, 31, 43, 45, 68],
            gpu_xids: vec![48, 63, 92, 94],
            node_xids: vec![74, 79, 95, 119, 120],
            repair_xids: vec![64],
            unknown_xid: Action::QuarantineGpu,
            single_bit_limit: 10_000,
            nvlink_error_limit: 1_000,
            temperature_limit_c: 90,
            suspect_after_s: 15,
            lost_after_s: 120,
            flap_limit: 3,
            flap_window_s: 3_600,
            hold_down_s: 1_800,
            repair_after: 3,
            repair_window_s: 86_400,
            mass_silence_percent: 25,
            mass_silence_min_nodes: 16,
            silent_losses_per_tick: 8,
        }
    }
}

impl HealthPolicy {
    /// What a tick may do about silent nodes when `silent` of the region's
    /// `fleet` nodes are silent (past `suspect_after_s`, lost ones not yet
    /// declared included).
    pub fn silence_verdict(&self, silent: usize, fleet: usize) -> SilenceVerdict {
        let mass = silent >= self.mass_silence_min_nodes as usize
            && silent * 100 >= fleet * self.mass_silence_percent as usize;
        if mass {
            SilenceVerdict::Hold
        } else {
            SilenceVerdict::Lose {
                at_most: (self.silent_losses_per_tick as usize).max(fleet.div_ceil(100)),
            }
        }
    }

    /// What an XID does under this policy.
    pub fn xid_action(&self, code: u32) -> Action {
        if self.application_xids.contains(&code) {
            Action::Ignore
        } else if self.repair_xids.contains(&code) {
            Action::Repair
        } else if self.node_xids.contains(&code) {
            Action::DrainNode
        } else if self.gpu_xids.contains(&code) {
            Action::QuarantineGpu
        } else {
            self.unknown_xid
        }
    }
}

/// Why a GPU or node is out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// A stable code: `xid_79`, `double_bit_ecc`, `remap_failed`, …
    pub code: String,
    /// Since when (seconds).
    pub since: u64,
}

/// What the node's agent and signals say, combined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Observed {
    /// Every GPU usable.
    Healthy,
    /// Some GPUs are quarantined (their work moves) or throttled (their
    /// work stays); the rest are usable.
    Degraded {
        quarantined: Vec<u32>,
        throttled: Vec<u32>,
    },
    /// The agent has been silent for a while: no new work.
    Suspect { silent_s: u64 },
    /// Silent for too long, or reported down: its jobs have failed.
    Lost,
    /// A node-level fault: drain, and wait for a reboot.
    Failed { fault: Fault },
    /// Recovered, but it flapped: held down until `until`.
    Damped { until: u64 },
    /// Out for repair until an operator returns it.
    NeedsRepair { fault: Fault },
}

impl Observed {
    pub fn code(&self) -> &'static str {
        match self {
            Observed::Healthy => "healthy",
            Observed::Degraded { .. } => "degraded",
            Observed::Suspect { .. } => "suspect",
            Observed::Lost => "lost",
            Observed::Failed { .. } => "failed",
            Observed::Damped { .. } => "damped",
            Observed::NeedsRepair { .. } => "needs_repair",
        }
    }
}

/// What operators asked of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Admin {
    Active,
    /// No new work; running jobs stay.
    Cordoned {
        reason: String,
    },
    /// No new work; running jobs checkpoint and move (`wait`: they may
    /// finish first) by the deadline.
    Draining {
        wait: bool,
        deadline: u64,
    },
    /// Taken by a maintenance wave.
    Maintenance {
        plan: String,
    },
    /// Sent out for repair.
    Repair {
        reason: String,
    },
}

impl Admin {
    pub fn code(&self) -> &'static str {
        match self {
            Admin::Active => "active",
            Admin::Cordoned { .. } => "cordoned",
            Admin::Draining { .. } => "draining",
            Admin::Maintenance { .. } => "maintenance",
            Admin::Repair { .. } => "repair",
        }
    }
}

/// The one answer both axes give together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// May the scheduler place new work on it?
    pub schedulable: bool,
    /// GPUs new work may use (when schedulable).
    pub usable: Vec<u32>,
    /// Should work on the node be asked to checkpoint and move?
    pub evacuate: bool,
    /// GPUs whose work should checkpoint and move even if the node stays.
    pub evacuate_gpus: Vec<u32>,
    /// Has the work on it failed (node lost or down)?
    pub lost: bool,
    /// Why not schedulable, in words, for operators.
    pub why: Option<String>,
}

/// Combines what operators asked with what agents observe: the only place
/// that decides whether a node may take work.
pub fn decide(admin: &Admin, observed: &Observed, gpus: u32) -> Decision {
    let all: Vec<u32> = (0..gpus).collect();
    let mut d = Decision {
        schedulable: true,
        usable: all.clone(),
        evacuate: false,
        evacuate_gpus: Vec::new(),
        lost: false,
        why: None,
    };
    let mut out = |why: String| {
        d.schedulable = false;
        d.usable.clear();
        d.why.get_or_insert(why);
    };
    match admin {
        Admin::Active => {}
        Admin::Cordoned { reason } => out(format!("cordoned by an operator: {reason}")),
        Admin::Draining { wait, .. } => {
            out("draining".into());
            d.evacuate = !wait;
        }
        Admin::Maintenance { plan } => {
            out(format!("in maintenance ({plan})"));
            d.evacuate = true;
        }
        Admin::Repair { reason } => {
            out(format!("out for repair: {reason}"));
            d.evacuate = true;
        }
    }
    match observed {
        Observed::Healthy => {}
        Observed::Degraded {
            quarantined,
            throttled,
        } => {
            d.usable
                .retain(|g| !quarantined.contains(g) && !throttled.contains(g));
            d.evacuate_gpus = quarantined.clone();
            if d.usable.is_empty() {
                d.schedulable = false;
                d.why
                    .get_or_insert("every GPU quarantined or throttled".into());
            }
        }
        Observed::Suspect { silent_s } => {
            d.schedulable = false;
            d.usable.clear();
            d.why
                .get_or_insert(format!("suspect: agent silent for {silent_s} s"));
        }
        Observed::Lost => {
            d.schedulable = false;
            d.usable.clear();
            d.lost = true;
            d.why.get_or_insert("lost: agent gone".into());
        }
        Observed::Failed { fault } => {
            d.schedulable = false;
            d.usable.clear();
            d.evacuate = true;
            d.why
                .get_or_insert(format!("failed ({}): drain and reboot", fault.code));
        }
        Observed::Damped { until } => {
            d.schedulable = false;
            d.usable.clear();
            d.why
                .get_or_insert(format!("flapping: held down until t={until}s"));
        }
        Observed::NeedsRepair { fault } => {
            d.schedulable = false;
            d.usable.clear();
            d.evacuate = true;
            d.why
                .get_or_insert(format!("needs repair ({})", fault.code));
        }
    }
    d
}

/// One GPU's tracked state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Gpu {
    /// Quarantined until a reset (None: not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quarantined: Option<Fault>,
    /// Needs repair: a reset does not help.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    broken: Option<Fault>,
    /// Too hot or throttling now.
    #[serde(default, skip_serializing_if = "is_false")]
    hot: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// Something the tracker decided, for the event log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    pub action: Action,
    /// The GPU concerned, for GPU-level actions.
    pub gpu: Option<u32>,
    pub code: String,
    pub message: String,
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Everything known about one node's health, fed with [`Signal`]s and the
/// time. Serializable, so a region can store it: what is at its default
/// (no fault, nothing remembered) is left out, so a healthy node's record
/// is small — a region rewrites it on every heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    gpus: Vec<Gpu>,
    last_heartbeat: Option<u64>,
    boot_id: Option<String>,
    /// A node-level fault waiting for a reboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fault: Option<Fault>,
    /// A fault that needs repair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repair: Option<Fault>,
    /// Down (reported or injected) until the next heartbeat with a new boot.
    #[serde(default, skip_serializing_if = "is_false")]
    down: bool,
    /// When it turned bad, within the flap window.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    turned_bad: VecDeque<u64>,
    /// Node-level failures, within the repair window.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    failures: VecDeque<u64>,
    /// Held down until then after flapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    damped_until: Option<u64>,
    /// Whether it was bad at the last observation (for flap counting).
    #[serde(default, skip_serializing_if = "is_false")]
    was_bad: bool,
    /// The bad spell under way is silence the region excused
    /// ([`NodeHealth::excuse_silence`]): it is not counted as a flap.
    #[serde(default, skip_serializing_if = "is_false")]
    silence_excused: bool,
}

impl NodeHealth {
    /// A node of `gpus` GPUs, not heard from yet.
    pub fn new(gpus: u32) -> NodeHealth {
        NodeHealth {
            gpus: vec![Gpu::default(); gpus as usize],
            last_heartbeat: None,
            boot_id: None,
            fault: None,
            repair: None,
            down: false,
            turned_bad: VecDeque::new(),
            failures: VecDeque::new(),
            damped_until: None,
            was_bad: false,
            silence_excused: false,
        }
    }

    /// Seconds since the last heartbeat at `now` (`None`: never heard, or
    /// down: a dead node is not merely silent).
    pub fn silent_s(&self, now: u64) -> Option<u64> {
        if self.down {
            return None;
        }
        self.last_heartbeat.map(|t| now.saturating_sub(t))
    }

    /// The boot id the agent last reported.
    pub fn boot_id(&self) -> Option<&str> {
        self.boot_id.as_deref()
    }

    /// Takes in one signal at `now`; returns what it led to.
    pub fn observe(&mut self, policy: &HealthPolicy, now: u64, signal: &Signal) -> Vec<Effect> {
        let mut effects = Vec::new();
        match signal {
            Signal::Heartbeat { boot_id } => {
                let rebooted = self.boot_id.as_ref().is_some_and(|b| b != boot_id);
                self.last_heartbeat = Some(now);
                self.boot_id = Some(boot_id.clone());
                if rebooted {
                    // A reset clears what a reset fixes.
                    self.down = false;
                    if let Some(f) = self.fault.take() {
                        effects.push(effect(
                            Action::Ignore,
                            None,
                            "recovered",
                            format!("rebooted: node fault {} cleared", f.code),
                        ));
                    }
                    for (i, g) in self.gpus.iter_mut().enumerate() {
                        if let Some(f) = g.quarantined.take() {
                            effects.push(effect(
                                Action::Ignore,
                                Some(i as u32),
                                "recovered",
                                format!("rebooted: GPU {i} quarantine ({}) cleared", f.code),
                            ));
                        }
                        g.hot = false;
                    }
                } else if self.down {
                    // Heard from again without a reboot: it was not down.
                    self.down = false;
                }
            }
            Signal::NodeDown => {
                // A repeated report of the same outage is one failure.
                if !self.down {
                    self.down = true;
                    self.node_failure(policy, now, "node_down", &mut effects);
                }
            }
            Signal::Xid { gpu, code } => {
                let action = policy.xid_action(*code);
                let code_s = format!("xid_{code}");
                match action {
                    Action::Ignore => effects.push(effect(
                        Action::Ignore,
                        Some(*gpu),
                        &code_s,
                        format!("XID {code} on GPU {gpu} is application-caused: ignored"),
                    )),
                    Action::Throttle | Action::QuarantineGpu => {
                        self.quarantine(*gpu, now, &code_s, &mut effects)
                    }
                    Action::DrainNode => {
                        // Counted once per fault: the same XID repeating, or
                        // a report sent again, is not another failure.
                        if self.fault.is_none() {
                            self.fail(now, &code_s, &mut effects);
                            self.node_failure(policy, now, &code_s, &mut effects);
                        }
                    }
                    Action::Repair => self.broken(*gpu, now, &code_s, &mut effects),
                }
            }
            Signal::Ecc {
                gpu,
                single_bit,
                double_bit,
            } => {
                if *double_bit > 0 {
                    self.quarantine(*gpu, now, "double_bit_ecc", &mut effects);
                } else if *single_bit >= policy.single_bit_limit {
                    self.quarantine(*gpu, now, "single_bit_ecc_rate", &mut effects);
                }
            }
            Signal::Remap {
                gpu,
                pending,
                failed,
            } => {
                if *failed {
                    self.broken(*gpu, now, "remap_failed", &mut effects);
                } else if *pending {
                    self.quarantine(*gpu, now, "remap_pending", &mut effects);
                }
            }
            Signal::Thermal {
                gpu,
                celsius,
                throttled,
            } => {
                let hot = *throttled || *celsius >= policy.temperature_limit_c;
                if let Some(g) = self.gpus.get_mut(*gpu as usize) {
                    if hot && !g.hot {
                        effects.push(effect(
                            Action::Throttle,
                            Some(*gpu),
                            "thermal",
                            format!(
                                "GPU {gpu} at {celsius} °C{}: no new work until it cools",
                                if *throttled { ", throttling" } else { "" }
                            ),
                        ));
                    }
                    g.hot = hot;
                }
            }
            // Rack-wide: the region acts on it for the whole leaf.
            Signal::RackThermal { .. } => {}
            Signal::Nvlink { gpu, errors } => {
                if *errors >= policy.nvlink_error_limit && self.fault.is_none() {
                    let _ = gpu;
                    self.fail(now, "nvlink_errors", &mut effects);
                    self.node_failure(policy, now, "nvlink_errors", &mut effects);
                }
            }
        }
        self.track_flaps(policy, now);
        effects
    }

    fn quarantine(&mut self, gpu: u32, now: u64, code: &str, effects: &mut Vec<Effect>) {
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return;
        };
        if g.quarantined.is_none() {
            g.quarantined = Some(Fault {
                code: code.into(),
                since: now,
            });
            effects.push(effect(
                Action::QuarantineGpu,
                Some(gpu),
                code,
                format!("GPU {gpu} quarantined ({code}) until a reset; its work moves"),
            ));
        }
    }

    fn broken(&mut self, gpu: u32, now: u64, code: &str, effects: &mut Vec<Effect>) {
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return;
        };
        let fault = Fault {
            code: code.into(),
            since: now,
        };
        g.broken.get_or_insert(fault.clone());
        if self.repair.is_none() {
            self.repair = Some(fault);
            effects.push(effect(
                Action::Repair,
                Some(gpu),
                code,
                format!("GPU {gpu} cannot recover ({code}): the node goes out for repair"),
            ));
        }
    }

    fn fail(&mut self, now: u64, code: &str, effects: &mut Vec<Effect>) {
        if self.fault.is_none() {
            self.fault = Some(Fault {
                code: code.into(),
                since: now,
            });
            effects.push(effect(
                Action::DrainNode,
                None,
                code,
                format!("node fault ({code}): cordoned and drained until it reboots healthy"),
            ));
        }
    }

    /// Counts a node-level failure; too many in the window send it to repair.
    fn node_failure(
        &mut self,
        policy: &HealthPolicy,
        now: u64,
        code: &str,
        effects: &mut Vec<Effect>,
    ) {
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|&t| t + policy.repair_window_s <= now)
        {
            self.failures.pop_front();
        }
        if self.failures.len() as u32 >= policy.repair_after && self.repair.is_none() {
            self.repair = Some(Fault {
                code: "repeated_failures".into(),
                since: now,
            });
            effects.push(effect(
                Action::Repair,
                None,
                "repeated_failures",
                format!(
                    "{} node failures within {} s (last: {code}): the node goes out for repair",
                    self.failures.len(),
                    policy.repair_window_s
                ),
            ));
        }
    }

    /// What its signals say now, before flap damping.
    fn raw_bad(&self, policy: &HealthPolicy, now: u64) -> bool {
        self.down
            || self.fault.is_some()
            || self
                .last_heartbeat
                .is_some_and(|t| now.saturating_sub(t) >= policy.suspect_after_s)
    }

    fn track_flaps(&mut self, policy: &HealthPolicy, now: u64) {
        let bad = self.raw_bad(policy, now);
        if bad && !self.was_bad {
            self.turned_bad.push_back(now);
        }
        while self
            .turned_bad
            .front()
            .is_some_and(|&t| t + policy.flap_window_s <= now)
        {
            self.turned_bad.pop_front();
        }
        if !bad && self.was_bad && self.turned_bad.len() as u32 >= policy.flap_limit {
            self.damped_until = Some(now + policy.hold_down_s);
        }
        if !bad {
            self.silence_excused = false;
        }
        self.was_bad = bad;
    }

    /// Takes the silence under way out of the flap count: the region found
    /// so many nodes silent at once ([`SilenceVerdict::Hold`]) that the
    /// cause is likely its own control plane or network, not this machine.
    /// A node that went quiet with hundreds of others and came back is no
    /// flapper: without this, three control-plane restarts in an hour would
    /// hold the whole region down. Only a spell of plain silence is excused
    /// (not a node reported down or faulty), once. Returns whether it
    /// changed anything.
    pub fn excuse_silence(&mut self, policy: &HealthPolicy, now: u64) -> bool {
        let silent = !self.down
            && self.fault.is_none()
            && self
                .silent_s(now)
                .is_some_and(|s| s >= policy.suspect_after_s);
        if !silent || !self.was_bad || self.silence_excused {
            return false;
        }
        // The spell's own entry: the newest (it is under way).
        self.turned_bad.pop_back();
        self.silence_excused = true;
        true
    }

    /// Lets time pass without a signal (heartbeat timeouts, hold-downs).
    pub fn tick(&mut self, policy: &HealthPolicy, now: u64) {
        self.track_flaps(policy, now);
    }

    /// [`NodeHealth::observed`], with silence past the lost limit held at
    /// suspect: what a node is during a mass silence
    /// ([`SilenceVerdict::Hold`]) or while its loss waits its turn.
    pub fn observed_holding_silence(&self, policy: &HealthPolicy, now: u64) -> Observed {
        match self.observed(policy, now) {
            Observed::Lost if !self.down => Observed::Suspect {
                silent_s: self.silent_s(now).unwrap_or(0),
            },
            o => o,
        }
    }

    /// The node's observed state at `now`.
    pub fn observed(&self, policy: &HealthPolicy, now: u64) -> Observed {
        if let Some(fault) = &self.repair {
            return Observed::NeedsRepair {
                fault: fault.clone(),
            };
        }
        if self.down {
            return Observed::Lost;
        }
        match self.last_heartbeat {
            None => {
                return Observed::Suspect { silent_s: 0 };
            }
            Some(t) => {
                let silent = now.saturating_sub(t);
                if silent >= policy.lost_after_s {
                    return Observed::Lost;
                }
                if silent >= policy.suspect_after_s {
                    return Observed::Suspect { silent_s: silent };
                }
            }
        }
        if let Some(fault) = &self.fault {
            return Observed::Failed {
                fault: fault.clone(),
            };
        }
        if let Some(until) = self.damped_until.filter(|&u| u > now) {
            return Observed::Damped { until };
        }
        let quarantined = self.evacuate_gpus();
        let throttled: Vec<u32> = (self.gpus.iter().enumerate())
            .filter(|(i, g)| g.hot && !quarantined.contains(&(*i as u32)))
            .map(|(i, _)| i as u32)
            .collect();
        if quarantined.is_empty() && throttled.is_empty() {
            Observed::Healthy
        } else {
            Observed::Degraded {
                quarantined,
                throttled,
            }
        }
    }

    /// GPUs whose work should checkpoint and move (quarantined or broken;
    /// throttled GPUs keep their work).
    pub fn evacuate_gpus(&self) -> Vec<u32> {
        (self.gpus.iter().enumerate())
            .filter(|(_, g)| g.quarantined.is_some() || g.broken.is_some())
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// An operator returned the node from repair: faults forgotten.
    pub fn repaired(&mut self) {
        self.repair = None;
        self.fault = None;
        self.failures.clear();
        self.turned_bad.clear();
        self.damped_until = None;
        for g in &mut self.gpus {
            *g = Gpu::default();
        }
    }
}

fn effect(action: Action, gpu: Option<u32>, code: &str, message: String) -> Effect {
    Effect {
        action,
        gpu,
        code: code.into(),
        message,
    }
}

#[cfg(test)]
mod tests;
