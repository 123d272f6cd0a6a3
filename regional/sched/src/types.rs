//! The data the core takes in (a [`Snapshot`]) and gives back (a [`Plan`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A level of the fabric, from the tightest to the widest. The order of the
/// variants is the order of preference: `Nvlink < Leaf < Spine < Region`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// One NVLink domain: a node, or a whole rack such as a GB200 NVL72.
    #[serde(alias = "node")]
    Nvlink,
    /// One leaf switch (a rack, or a rail group).
    Leaf,
    /// One spine (a pod).
    Spine,
    /// Anywhere in the region.
    Region,
}

impl Level {
    /// Every level, tightest first.
    pub const ALL: [Level; 4] = [Level::Nvlink, Level::Leaf, Level::Spine, Level::Region];

    /// The tightest level with one domain holding every one of these nodes,
    /// each given by its path (spine, leaf, NVLink domain); `Nvlink` for
    /// none. Paths are compared whole, so two spines may name a leaf alike.
    pub fn holding<'a>(paths: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Level {
        let mut paths = paths.into_iter();
        let Some(first) = paths.next() else {
            return Level::Nvlink;
        };
        let mut same = [true; 3];
        for (spine, leaf, nvlink) in paths {
            same[2] &= spine == first.0;
            same[1] &= same[2] && leaf == first.1;
            same[0] &= same[1] && nvlink == first.2;
        }
        match same {
            [true, ..] => Level::Nvlink,
            [_, true, _] => Level::Leaf,
            [_, _, true] => Level::Spine,
            _ => Level::Region,
        }
    }

    /// The level's wire name: `nvlink`, `leaf`, `spine` or `region`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Nvlink => "nvlink",
            Level::Leaf => "leaf",
            Level::Spine => "spine",
            Level::Region => "region",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Level`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseLevelError(pub String);

impl fmt::Display for ParseLevelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown topology level {:?}: expected one of nvlink (or node), leaf, spine, region",
            self.0
        )
    }
}

impl std::error::Error for ParseLevelError {}

impl FromStr for Level {
    type Err = ParseLevelError;

    /// Accepts the wire names and `node` as another name for `nvlink`.
    fn from_str(s: &str) -> Result<Level, ParseLevelError> {
        match s {
            "nvlink" | "node" => Ok(Level::Nvlink),
            "leaf" => Ok(Level::Leaf),
            "spine" => Ok(Level::Spine),
            "region" => Ok(Level::Region),
            _ => Err(ParseLevelError(s.to_string())),
        }
    }
}

/// One machine as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Unique within the snapshot; when an id repeats, only its first entry counts.
    pub id: String,
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
    pub gpu_type: String,
    pub gpus: u32,
    /// Free GPU indices, sorted. Indices `>= gpus` and repeats are ignored.
    pub free: Vec<u32>,
    /// False for cordoned, draining, unhealthy or spare nodes.
    pub schedulable: bool,
}

/// One unit to place whole: a gang, or one worker of an array job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Job id.
    pub job: String,
    /// The worker ranks this unit covers (a gang: `0..W`; an array worker:
    /// `[r]`). Workers = `ranks.len()`.
    pub ranks: Vec<u32>,
    pub tenant: String,
    pub gpu_type: String,
    /// Each worker is one process on one node with this many GPUs.
    pub gpus_per_worker: u32,
    /// The whole unit must lie inside one domain of this level
    /// (`Region` = anywhere).
    pub required: Level,
    /// Informational: a caller can report a placement whose level is above it.
    pub preferred: Level,
    /// Higher goes first.
    pub priority: i32,
    /// Submission order; lower is older and goes first among equal priorities.
    pub seq: u64,
    /// The tenant's estimate of the run time, in seconds: what reservations
    /// and backfill reason with. 0 = unknown: treated as never ending, so
    /// the unit never backfills onto reserved GPUs and frees nothing in the
    /// timeline a reservation is computed from.
    #[serde(default)]
    pub estimated_duration_s: u64,
    /// Elastic units (Gangway's discipline): the fewest workers it may
    /// start with. When all of `ranks` do not fit, it starts with the most
    /// that do, at least this many (the lowest ranks); a placement then
    /// covers a prefix of `ranks`. 0, or `ranks.len()` and above: not
    /// elastic, all or nothing. The other disciplines place it whole.
    #[serde(default)]
    pub min_workers: u32,
    /// When its job was submitted (snapshot clock): how long it has waited,
    /// for [`Policy::size_aging_s`]. 0 when the caller does not say.
    #[serde(default)]
    pub submitted: u64,
    /// The capacity reservation ([`Snapshot::reserved`]) it runs in: it is
    /// placed only inside the reservation's domain, within its GPUs, ahead
    /// of other work and outside the tenant's quota; `None`: ordinary work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
}

impl Request {
    /// GPUs the whole unit needs.
    pub fn gpus(&self) -> u64 {
        self.ranks.len() as u64 * u64::from(self.gpus_per_worker)
    }

    /// Whether it may start with fewer than all its workers.
    pub fn is_elastic(&self) -> bool {
        self.min_workers > 0 && (self.min_workers as usize) < self.ranks.len()
    }

    /// GPUs the smallest start needs: all workers, or `min_workers` if elastic.
    pub fn min_gpus(&self) -> u64 {
        if self.is_elastic() {
            u64::from(self.min_workers) * u64::from(self.gpus_per_worker)
        } else {
            self.gpus()
        }
    }
}

/// Everything one planning pass looks at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The state's version; a plan is only valid against this generation.
    pub generation: i64,
    /// Per GPU type, the version of that type's scheduling partition (the
    /// caller's, like `generation`; copied into the plan): a plan's
    /// decisions about a type are only valid against it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partitions: BTreeMap<String, i64>,
    pub nodes: Vec<Node>,
    /// Queued units, in any order (the pass sorts them).
    pub queue: Vec<Request>,
    /// (tenant, gpu_type) -> the most GPUs that tenant may hold at once, its
    /// borrowing limit included; absent = unlimited.
    pub quotas: BTreeMap<(String, String), u32>,
    /// (tenant, gpu_type) -> what fair sharing knows of the tenant for the
    /// type: guaranteed GPUs, weight, decayed past usage. Absent = nothing
    /// guaranteed, weight 1, no history.
    #[serde(default)]
    pub shares: BTreeMap<(String, String), Share>,
    /// (tenant, gpu_type) -> GPUs allocated now.
    pub usage: BTreeMap<(String, String), u32>,
    /// The time of the snapshot, in seconds on the caller's clock (wall
    /// time in a region, virtual time in the simulator). The core never
    /// reads a clock.
    #[serde(default)]
    pub now: u64,
    /// Units holding GPUs now, with when they are expected to end: what
    /// reservations for waiting gangs are computed from.
    #[serde(default)]
    pub running: Vec<Running>,
    /// GPUs of each type in the whole region, for dominant shares, when
    /// `nodes` holds only part of it (a partition, [`Snapshot::partition`]).
    /// Empty: counted from `nodes`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, u64>,
    /// GPU type → watts one allocated GPU of it draws (its enforced power
    /// limit), for rack power budgets. Absent: not counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_power_w: BTreeMap<String, u32>,
    /// (rack = leaf, GPU type) → watts this pass's placements of that type
    /// may still add on that rack: its power budget less what its
    /// allocated GPUs draw (the type's share where types share a rack).
    /// Absent: no budget. No placement ever takes more (`power.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub power_headroom_w: BTreeMap<(String, String), u64>,
    /// Capacity reservations not yet over (`reserved.rs`): the pass keeps
    /// their GPUs for their owners' units, lending them meanwhile only to
    /// work that ends before they start or (where [`Policy::lend_reserved`])
    /// that may be preempted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<ReservedCapacity>,
    /// Queued jobs that preempted running units to start, each with the
    /// time (this clock) until which it comes before every priority class
    /// in Gangway's order, so that what its victims free is its own
    /// (`fair.rs`): callers record [`PreemptionPolicy::claim_until`] when
    /// they carry out a plan's preemptions. A unit whose victims are still
    /// leaving comes first anyway; this covers the pass that finds them
    /// gone. Entries before `now` count for nothing.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, u64>,
}

impl Snapshot {
    /// The jobs owed what their victims free: a claim not past `now`, or
    /// victims still leaving. They come first in Gangway's order, so
    /// callers that show a pass a window of the queue
    /// ([`QueueWindow`]) show them whatever their place. (The planner
    /// itself counts victims in flight only where it plans their type.)
    pub fn owed(&self) -> BTreeSet<&str> {
        owed(&self.claims, &self.running, self.now)
    }
}

/// [`Snapshot::owed`] of the parts, for a caller still assembling them.
pub fn owed<'s>(
    claims: &'s BTreeMap<String, u64>,
    running: &'s [Running],
    now: u64,
) -> BTreeSet<&'s str> {
    (claims.iter())
        .filter(|&(_, &until)| until >= now)
        .map(|(job, _)| job.as_str())
        .chain(running.iter().filter_map(|r| r.preempted_for.as_deref()))
        .collect()
}

/// Capacity promised to a tenant: `gpus` GPUs of `gpu_type` inside one
/// domain, from `start` on (until `end`), as admitted by
/// [`crate::capacity::admit`] (which pinned it to its domain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservedCapacity {
    pub id: String,
    pub tenant: String,
    pub gpu_type: String,
    pub gpus: u32,
    /// The level of its domain, and the domain's path from the region down
    /// (`[spine]`, `[spine, leaf]`, `[spine, leaf, NVLink domain]`; empty
    /// for the region).
    pub level: Level,
    pub path: Vec<String>,
    pub start: u64,
    /// `None`: open-ended.
    pub end: Option<u64>,
}

impl ReservedCapacity {
    /// Whether `node` is inside the reservation's domain.
    pub fn holds(&self, node: &Node) -> bool {
        let parts = [&node.spine, &node.leaf, &node.nvlink_domain];
        self.path.len() <= 3 && self.path.iter().zip(parts).all(|(a, b)| a == b)
    }

    /// Whether it is over at `now`.
    pub fn over(&self, now: u64) -> bool {
        self.end.is_some_and(|e| e <= now)
    }
}

/// A tenant's terms and history for one GPU type, for fair sharing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// GPUs the tenant is guaranteed. Capacity it does not use is lent to
    /// others; while it holds fewer, it may take lent GPUs back by
    /// preempting borrowers (tenants holding more than their guarantee).
    #[serde(default)]
    pub guaranteed: u32,
    /// Fair-share weight in thousandths (1000 = 1.0; 0 counts as 1000).
    #[serde(default = "Share::default_weight")]
    pub weight: u32,
    /// Past usage, decayed so that history counts but fades: the average
    /// GPUs of the type held over the recent past, in thousandths (the
    /// caller chooses the decay; the core only compares).
    #[serde(default)]
    pub history: u64,
}

impl Share {
    fn default_weight() -> u32 {
        1000
    }

    /// The weight in thousandths, never 0.
    pub fn weight(&self) -> u32 {
        if self.weight == 0 {
            1000
        } else {
            self.weight
        }
    }
}

impl Default for Share {
    fn default() -> Share {
        Share {
            guaranteed: 0,
            weight: 1000,
            history: 0,
        }
    }
}

/// The window of the queue a planning pass is shown, as the simulator and
/// the region both apply it (the core plans whatever it is given): the
/// first [`QueueWindow::cap`] units in queue order (priority, then `seq`)
/// and, beyond those, each tenant's first [`QueueWindow::per_tenant`]. The
/// rest wait their turn and move in as units ahead of them leave. A pass
/// then costs the same at 2,000 queued units as at 50,000 (issue 23), and
/// the tenant part keeps fair sharing honest: with a plain window, a
/// tenant whose work arrived behind another's large backlog would be
/// invisible to the pass, however far below its guarantee it is. Slurm's
/// `default_queue_depth` and `bf_max_job_test` bound its passes the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueWindow {
    /// Units shown in queue order (at least 1).
    pub cap: usize,
    /// Beyond those, each tenant's first this many units (0: none).
    pub per_tenant: usize,
}

impl QueueWindow {
    /// Whether a unit with `ahead` units before it in the whole queue and
    /// `tenant_ahead` before it in its tenant's is in the window.
    pub fn shows(&self, ahead: usize, tenant_ahead: usize) -> bool {
        ahead < self.cap || tenant_ahead < self.per_tenant
    }
}

impl Default for QueueWindow {
    fn default() -> QueueWindow {
        QueueWindow {
            cap: 2_000,
            per_tenant: 32,
        }
    }
}

/// The priority at and below which running units may be preempted for
/// higher-priority work (the API's `low` is 0, `normal` 1, `high` 2).
pub const PREEMPTIBLE_PRIORITY: i32 = 0;

/// A unit holding GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub job: String,
    pub tenant: String,
    pub gpu_type: String,
    pub priority: i32,
    /// (node id, GPU indices) it holds.
    pub gpus: Vec<(String, Vec<u32>)>,
    /// When it is expected to end, on the snapshot's clock (start +
    /// estimated duration). An end at or before `now` (overrun) counts as
    /// now; `u64::MAX` means no known end (an estimate of 0): its GPUs are
    /// never counted as freeing.
    pub expected_end: u64,
    /// When this run started (snapshot clock): the minimum run time before
    /// it may be preempted counts from here.
    #[serde(default)]
    pub started: u64,
    /// When it last wrote a checkpoint, if it has one from this run or an
    /// earlier one; work since `max(started, checkpointed)` is what a
    /// preemption puts at risk.
    #[serde(default)]
    pub checkpointed: Option<u64>,
    /// How often it has been preempted already (the cap counts these).
    #[serde(default)]
    pub preemptions: u32,
    /// Set while it is being preempted (asked to checkpoint and stop): the
    /// job it makes room for ("" when an operator asked). Such a unit is
    /// expected to free its GPUs within the checkpoint deadline and is
    /// never chosen again.
    #[serde(default)]
    pub preempted_for: Option<String>,
    /// When it was asked to checkpoint and stop (with `preempted_for`):
    /// its GPUs are expected free by this plus the checkpoint deadline.
    /// `None`: assume now.
    #[serde(default)]
    pub preempted_at: Option<u64>,
    /// For an elastic unit: its shape, so the core can restart it larger
    /// when idle GPUs could hold more of its workers.
    #[serde(default)]
    pub elastic: Option<Elastic>,
    /// The capacity reservation it runs in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
}

/// The shape of a running elastic unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elastic {
    /// Workers it runs with now.
    pub workers: u32,
    /// The most it may run with.
    pub max_workers: u32,
    pub gpus_per_worker: u32,
    /// All its workers must lie in one domain of this level.
    pub required: Level,
}

impl Running {
    /// When a unit being preempted is expected to have let go of its GPUs:
    /// the checkpoint deadline after it was asked, and not before `now`.
    pub fn leaves_by(&self, now: u64, deadline_s: u64) -> u64 {
        self.preempted_at
            .unwrap_or(now)
            .saturating_add(deadline_s)
            .max(now)
    }

    /// GPUs it holds.
    pub fn gpu_count(&self) -> u64 {
        self.gpus.iter().map(|(_, g)| g.len() as u64).sum()
    }

    /// GPU-seconds of work done since its last checkpoint (or start) at
    /// `now`: what it would lose if stopped without checkpointing.
    pub fn at_risk_gpu_s(&self, now: u64) -> u64 {
        let since = self
            .checkpointed
            .map_or(self.started, |c| c.max(self.started));
        now.saturating_sub(since).saturating_mul(self.gpu_count())
    }
}

/// Which scheduling discipline a pass follows. All three share placement
/// mechanics; the simulator compares them on one trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Gangway's policy: priority then age; topology-aware best fit; the
    /// first four waiting units of each GPU type get reservations, each on
    /// the domain of its preferred level where it can start soonest, and the
    /// rest backfill around them.
    #[default]
    Gangway,
    /// What a plain Kubernetes setup gives: arrival order, each unit
    /// placed on the first nodes with room (node id order), no topology
    /// awareness, nothing reserved (a unit that does not fit is skipped).
    FifoFirstFit,
    /// Slurm-like: priority then age, tree-topology placement, EASY
    /// backfill (only the head of the queue holds a reservation).
    SlurmBackfill,
}

/// Knobs of a pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Stop the pass after this many placements; units not reached yet appear
    /// in neither list of the plan. `None` = no limit.
    pub max_placements: Option<usize>,
    /// The discipline (default: Gangway's).
    #[serde(default)]
    pub kind: PolicyKind,
    /// When Gangway's discipline preempts (the others never do).
    #[serde(default)]
    pub preemption: PreemptionPolicy,
    /// Gangway's discipline: within one tenant and priority class, smaller
    /// work first. Units are ranked by the power of two of their estimated
    /// GPU-seconds (unknown estimates rank last), and each this many
    /// seconds of waiting lifts a unit one rank, so large jobs catch up
    /// instead of starving; equal ranks keep submission order. 0: plain
    /// submission order.
    #[serde(default = "Policy::default_size_aging_s")]
    pub size_aging_s: u64,
    /// Gangway's discipline: a gang that cannot start now waits for a
    /// domain of its preferred level only while that start is no later than
    /// this percentage of its estimated run time after the first start at
    /// any level it allows; beyond that it reserves where it can start
    /// first (spread wider, but sooner).
    #[serde(default = "Policy::default_locality_patience_pct")]
    pub locality_patience_pct: u32,
    /// Whether capacity reservations ([`Snapshot::reserved`]) lend the GPUs
    /// their owners leave idle to preemptible units (priority ≤
    /// [`PREEMPTIBLE_PRIORITY`]), which give them back when the owner needs
    /// them (`PreemptCause::Reservation`). Off: during its window a
    /// reservation's held GPUs run its owner's units only, whatever the
    /// priority of the rest; before its start, units that end by then may
    /// still use them either way (they are free again when it starts).
    #[serde(default = "Policy::default_lend_reserved")]
    pub lend_reserved: bool,
    /// Gangway's discipline: a unit of one worker with a known end goes to
    /// the node whose busy horizon (when the last unit on it is expected to
    /// end) it extends least, then the best fit — so units that end
    /// together share nodes and nodes come free whole for whole-node work.
    /// Off: the best fit alone (fewest free GPUs, then topology order).
    #[serde(default = "Policy::default_pack_by_end")]
    pub pack_by_end: bool,
}

impl Policy {
    fn default_size_aging_s() -> u64 {
        3_600
    }

    fn default_locality_patience_pct() -> u32 {
        25
    }

    fn default_lend_reserved() -> bool {
        true
    }

    fn default_pack_by_end() -> bool {
        true
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            max_placements: None,
            kind: PolicyKind::default(),
            preemption: PreemptionPolicy::default(),
            size_aging_s: Policy::default_size_aging_s(),
            locality_patience_pct: Policy::default_locality_patience_pct(),
            lend_reserved: Policy::default_lend_reserved(),
            pack_by_end: Policy::default_pack_by_end(),
        }
    }
}

/// The rules of preemption under [`PolicyKind::Gangway`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PreemptionPolicy {
    /// Off: nothing is ever preempted by the scheduler.
    pub enabled: bool,
    /// A run younger than this (seconds since `started`) is never a victim;
    /// doubled for each time the unit was preempted before
    /// ([`Self::min_run_for`]).
    pub min_run_s: u64,
    /// A job preempted this many times is no longer a victim of priority
    /// preemption (a tenant reclaiming its guarantee still may take it back).
    pub max_preemptions: u32,
    /// At most this many victims are chosen in one pass.
    pub max_victims_per_pass: usize,
    /// How long a victim has to checkpoint and stop (seconds): its GPUs are
    /// expected to be free by then.
    pub checkpoint_deadline_s: u64,
    /// A reserved gang may move small units of its class or lower, low
    /// priority or borrowed, out of the way ([`PreemptCause::Defrag`]).
    pub defrag: bool,
}

/// The most times [`PreemptionPolicy::min_run_s`] is doubled for a unit
/// preempted before: 64 × 600 s is nearly 11 hours.
pub const MAX_BACKOFF_DOUBLINGS: u32 = 6;

impl PreemptionPolicy {
    /// Until when a unit that chose victims at `now` has the first claim
    /// on what they free ([`Snapshot::claims`]): their checkpoint deadline,
    /// and as long again for the pass that finds them gone.
    pub fn claim_until(&self, now: u64) -> u64 {
        now.saturating_add(self.checkpoint_deadline_s.saturating_mul(2))
    }

    /// How long a unit preempted `times` times before must have run since it
    /// last started before it may be preempted again, for any cause but a
    /// capacity reservation taking back its own GPUs: `min_run_s`, doubled
    /// per earlier preemption (up to [`MAX_BACKOFF_DOUBLINGS`] times). So a
    /// borrower that keeps being reclaimed runs longer each time, and a run
    /// of `d` seconds is preempted at most about log2(d / min_run_s) + 1
    /// times, whatever the cause.
    pub fn min_run_for(&self, times: u32) -> u64 {
        self.min_run_s
            .saturating_mul(1u64 << times.min(MAX_BACKOFF_DOUBLINGS))
    }
}

impl Default for PreemptionPolicy {
    fn default() -> PreemptionPolicy {
        PreemptionPolicy {
            enabled: true,
            min_run_s: 600,
            max_preemptions: 3,
            max_victims_per_pass: 32,
            checkpoint_deadline_s: 120,
            defrag: true,
        }
    }
}

/// The result of one pass: what to start, and why the rest waits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The snapshot generation the plan was computed at.
    pub generation: i64,
    /// The snapshot's partition versions ([`Snapshot::partitions`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partitions: BTreeMap<String, i64>,
    /// In the order they were decided (the queue order).
    pub placements: Vec<Placement>,
    /// In queue order.
    pub waiting: Vec<Waiting>,
    /// GPUs held back for waiting gangs, so backfill cannot starve them.
    #[serde(default)]
    pub reservations: Vec<Reservation>,
    /// Running units to ask to checkpoint and stop, to make room for
    /// waiting ones, in the order they were chosen.
    #[serde(default)]
    pub preemptions: Vec<Preemption>,
    /// The units those preemptions are for, each with until when it has
    /// the first claim on what its victims free
    /// ([`PreemptionPolicy::claim_until`]): the caller carries them into
    /// the next snapshots' [`Snapshot::claims`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, u64>,
}

/// Why a running unit is preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptCause {
    /// A higher-priority unit needs its GPUs (the victim is low priority).
    Priority,
    /// Its tenant borrows beyond its guarantee, and a tenant under its own
    /// guarantee takes the capacity back.
    Reclaim,
    /// An elastic unit running below its maximum restarts (from its
    /// checkpoint) larger: idle GPUs nobody waits for could hold at least
    /// half as many workers again. `for_job` is the unit itself.
    Grow,
    /// Defragmentation: a small unit (on one node, fewer GPUs than one
    /// worker of the gang), low priority or of a tenant beyond its
    /// guarantee, is moved — checkpointed, stopped and requeued, with room
    /// for it elsewhere — so that a reserved gang of its class or higher
    /// waiting for whole nodes can start now instead of at its reservation.
    Defrag,
    /// Capacity reservation: a preemptible unit borrowing GPUs of a
    /// reservation gives them back to the owner's unit that needs them.
    Reservation,
}

impl PreemptCause {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptCause::Priority => "priority",
            PreemptCause::Reclaim => "reclaim",
            PreemptCause::Grow => "grow",
            PreemptCause::Defrag => "defrag",
            PreemptCause::Reservation => "reservation",
        }
    }
}

/// One running unit to checkpoint and stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    /// The victim's job id.
    pub job: String,
    /// The waiting job it makes room for.
    pub for_job: String,
    pub cause: PreemptCause,
    /// GPU-seconds since the victim's last checkpoint: lost if it cannot
    /// checkpoint before the deadline.
    pub at_risk_gpu_s: u64,
    /// GPUs it frees.
    pub gpus: u64,
}

/// GPUs set aside for a waiting unit from an expected start time on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub job: String,
    pub ranks: Vec<u32>,
    /// When the unit is expected to be able to start (snapshot clock).
    pub start: u64,
    /// The topology level of the domain the reservation sits in.
    pub level: Level,
    /// (node id, GPU indices) it will use.
    pub gpus: Vec<(String, Vec<u32>)>,
}

/// One unit placed whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub job: String,
    pub ranks: Vec<u32>,
    /// The level of the single domain that holds every worker.
    pub level: Level,
    /// One per rank, in topology order; ranks on one node are contiguous.
    pub workers: Vec<WorkerPlacement>,
}

/// Where one worker runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerPlacement {
    pub rank: u32,
    pub node: String,
    /// GPU indices on that node, ascending.
    pub gpus: Vec<u32>,
}

/// One unit that was not placed in this pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub job: String,
    pub ranks: Vec<u32>,
    pub reason: WaitReason,
}

/// Why a unit waits. Serialized with its [`WaitReason::code`] as `code`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum WaitReason {
    /// Placing it would take the tenant past its quota for the GPU type.
    OverQuota {
        gpu_type: String,
        quota: u32,
        in_use: u32,
        requested: u32,
    },
    /// No single domain of the required level (or below) has room for it now
    /// (under FIFO, which ignores `required`, the type has too few GPUs:
    /// `required` is then `region`).
    NoCapacity {
        required: Level,
        /// Schedulable free GPUs of the type in the whole region.
        free_gpus: u32,
    },
    /// The unit can never be placed as written (no ranks, a repeated rank,
    /// or zero GPUs per worker). The API should have refused it.
    Invalid { detail: String },
    /// It holds a reservation and starts when enough GPUs free up.
    Reserved { start: u64, level: Level },
    /// It would fit, but only on GPUs reserved for an earlier unit, and it
    /// would not finish before that unit's reservation starts.
    BlockedByReservation { job: String, start: u64 },
    /// Running units were asked to checkpoint and stop to make room for it;
    /// their GPUs are expected to be free by `until`.
    Preempting { victims: Vec<String>, until: u64 },
    /// It names a capacity reservation it cannot run in (none by that id,
    /// another tenant's, another GPU type's, or over).
    ReservationUnavailable { reservation: String, detail: String },
    /// Its reservation starts at `start`.
    ReservationNotStarted { reservation: String, start: u64 },
    /// Its reservation's GPUs are taken by the owner's other units.
    ReservationFull {
        reservation: String,
        gpus: u32,
        in_use: u32,
        requested: u32,
    },
    /// It would fit, but only on GPUs of a capacity reservation, and it is
    /// not done before the reservation starts, nor preemptible where the
    /// policy lends reserved GPUs ([`Policy::lend_reserved`]).
    HeldForReservation { reservation: String, start: u64 },
}

impl WaitReason {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            WaitReason::OverQuota { .. } => "over_quota",
            WaitReason::NoCapacity { .. } => "no_capacity",
            WaitReason::Invalid { .. } => "invalid_request",
            WaitReason::Reserved { .. } => "reserved",
            WaitReason::BlockedByReservation { .. } => "reserved_for_other",
            WaitReason::Preempting { .. } => "waiting_for_preemption",
            WaitReason::ReservationUnavailable { .. } => "reservation_unavailable",
            WaitReason::ReservationNotStarted { .. } => "reservation_not_started",
            WaitReason::ReservationFull { .. } => "reservation_full",
            WaitReason::HeldForReservation { .. } => "reserved_capacity",
        }
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::OverQuota {
                gpu_type,
                quota,
                in_use,
                requested,
            } => write!(
                f,
                "over quota: needs {requested} {gpu_type} GPUs but the tenant already holds \
                 {in_use} of its {quota}"
            ),
            WaitReason::NoCapacity {
                required,
                free_gpus,
            } => write!(
                f,
                "no capacity: no single {required} domain has room for all workers now \
                 ({free_gpus} schedulable GPUs of this type free in the region)"
            ),
            WaitReason::Invalid { detail } => write!(f, "invalid request: {detail}"),
            WaitReason::Reserved { start, level } => write!(
                f,
                "reserved: GPUs in one {level} domain are set aside for it from t={start}s, \
                 when running jobs are expected to free them"
            ),
            WaitReason::BlockedByReservation { job, start } => write!(
                f,
                "reserved for job {job}: the free GPUs are held for it from t={start}s and \
                 this job would not finish before then"
            ),
            WaitReason::Preempting { victims, until } => {
                let n = victims.len();
                let jobs = if n == 1 { "job" } else { "jobs" };
                write!(
                    f,
                    "waiting for victims to checkpoint: {n} running {jobs} ({}) asked to \
                     checkpoint and stop to make room for it, expected to be free by t={until}s",
                    victims.join(", ")
                )
            }
            WaitReason::ReservationUnavailable {
                reservation,
                detail,
            } => write!(f, "reservation {reservation} cannot run it: {detail}"),
            WaitReason::ReservationNotStarted { reservation, start } => write!(
                f,
                "reservation {reservation} starts at t={start}s; the job waits for it"
            ),
            WaitReason::ReservationFull {
                reservation,
                gpus,
                in_use,
                requested,
            } => write!(
                f,
                "reservation {reservation} is full: its other jobs hold {in_use} of its {gpus} \
                 GPUs and this one needs {requested}"
            ),
            WaitReason::HeldForReservation { reservation, start } => write!(
                f,
                "the free GPUs that would fit it are reservation {reservation}'s (from \
                 t={start}s); only preemptible work, or work done before then, may use them"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Wrap {
        level: Level,
    }

    #[test]
    fn the_level_holding_nodes_compares_whole_paths() {
        assert_eq!(Level::holding([]), Level::Nvlink);
        assert_eq!(
            Level::holding([("s0", "l0", "n0"), ("s0", "l0", "n0")]),
            Level::Nvlink
        );
        assert_eq!(
            Level::holding([("s0", "l0", "n0"), ("s0", "l0", "n1")]),
            Level::Leaf
        );
        assert_eq!(
            Level::holding([("s0", "l0", "n0"), ("s0", "l1", "n0")]),
            Level::Spine
        );
        // Leaf `l0` of two spines is two leaves.
        assert_eq!(
            Level::holding([("s0", "l0", "n0"), ("s1", "l0", "n0")]),
            Level::Region
        );
    }

    #[test]
    fn level_names_round_trip() {
        for level in Level::ALL {
            assert_eq!(level.as_str().parse::<Level>(), Ok(level));
            assert_eq!(level.to_string(), level.as_str());
            let text = toml::to_string(&Wrap { level }).unwrap();
            assert_eq!(text.trim(), format!("level = \"{}\"", level.as_str()));
            assert_eq!(toml::from_str::<Wrap>(&text).unwrap().level, level);
        }
        assert_eq!("node".parse::<Level>(), Ok(Level::Nvlink));
        assert_eq!(
            toml::from_str::<Wrap>("level = \"node\"").unwrap().level,
            Level::Nvlink
        );
        assert!("rack"
            .parse::<Level>()
            .unwrap_err()
            .to_string()
            .contains("rack"));
        assert!(Level::Nvlink < Level::Leaf && Level::Spine < Level::Region);
    }

    #[test]
    fn wait_reasons_have_codes_and_messages() {
        let q = WaitReason::OverQuota {
            gpu_type: "h100".into(),
            quota: 16,
            in_use: 12,
            requested: 8,
        };
        assert_eq!(q.code(), "over_quota");
        assert!(q.to_string().contains("needs 8 h100 GPUs"), "{q}");
        let c = WaitReason::NoCapacity {
            required: Level::Leaf,
            free_gpus: 3,
        };
        assert_eq!(c.code(), "no_capacity");
        assert!(c.to_string().contains("no single leaf domain"), "{c}");
    }
}
