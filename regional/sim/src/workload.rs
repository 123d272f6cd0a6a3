//! Preparing a run: the fleet as the scheduler sees it and the trace's jobs
//! as units to place. Built once by [`Simulation::new`] and shared by every
//! policy's run.

use std::collections::BTreeMap;

use gangway_sched::capacity::{admit, Admission, Ask, Promised};
use gangway_sched::{Level, Node, ReservedCapacity};
use gangway_shared::fleet::FleetNode;
use serde::Serialize;

use crate::config::{SimConfig, SpareMode};
use crate::rng::SimRng;
use crate::trace::Trace;

/// Streams of the seeded PRNG, one per purpose.
pub(crate) const STREAM_FAILURES: u64 = 1;
pub(crate) const STREAM_ESTIMATES: u64 = 2;

/// The trace and fleet prepared for replay, policy-independent.
pub struct Simulation {
    pub(crate) config: SimConfig,
    pub(crate) gpu_type: String,
    /// The fleet's nodes of `gpu_type`, in id (topology) order.
    pub(crate) nodes: Vec<FleetNode>,
    pub(crate) node_at: BTreeMap<String, u32>,
    /// Per node: its leaf's index (for "could a leaf have held it").
    pub(crate) leaf_of: Vec<u32>,
    pub(crate) leaves: u32,
    /// Nodes that can fail (the non-spare ones).
    pub(crate) failable: Vec<u32>,
    pub(crate) scheduled_failures: Vec<(u64, u32)>,
    pub(crate) fleet_gpus: u64,
    pub(crate) tenants: Vec<String>,
    pub(crate) shares: Vec<f64>,
    /// GPUs guaranteed per tenant index (`floor(share × fleet GPUs)`).
    pub(crate) guarantees: Vec<u64>,
    /// Fair-share weight per tenant index, in thousandths.
    pub(crate) weights: Vec<u32>,
    /// Hard quota per tenant index, when capped.
    pub(crate) quotas: Vec<Option<u32>>,
    /// The capacity reservations made at the start ([`SimConfig::reserve_pct`]).
    pub(crate) reserved: Vec<ReservedCapacity>,
    /// Per tenant index: its reservation's index in `reserved`, if any.
    pub(crate) reservation_of: Vec<Option<u32>>,
    /// Per node: inside some reservation's domain.
    pub(crate) in_reserved_domain: Vec<bool>,
    pub(crate) jobs: Vec<JobSpec>,
    pub(crate) summary: WorkloadSummary,
}

/// One job as the simulator runs it.
#[derive(Clone, Debug)]
pub(crate) struct JobSpec {
    pub tenant: u32,
    /// Arrival, seconds of virtual time after the first job's.
    pub submit: u64,
    /// Seconds of run time at full speed (the trace's duration).
    pub work: f64,
    /// What the scheduler is told the run time is.
    pub est_work: f64,
    pub workers: u32,
    pub gpus_per_worker: u32,
    /// The tightest level any domain of the empty fleet can hold it at.
    pub best: Level,
    pub priority: i32,
    pub rejected: bool,
}

impl JobSpec {
    pub fn gpus(&self) -> u64 {
        u64::from(self.workers) * u64::from(self.gpus_per_worker)
    }
}

/// What was replayed, for the report header.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkloadSummary {
    pub jobs: u64,
    pub skipped_rows: u64,
    pub gpu_type: String,
    /// Nodes in service at the start (spares excluded).
    pub nodes: u64,
    /// Spare nodes of the simulated type (0 with `SpareMode::Capacity`).
    pub spare_nodes: u64,
    pub spares: SpareMode,
    pub fleet_gpus: u64,
    /// GPUs per node (the largest worker).
    pub node_gpus: u32,
    /// Jobs whose GPU count was rounded up to whole nodes.
    pub jobs_rounded_up: u64,
    /// Jobs larger than the fleet, or than their tenant's hard quota.
    pub jobs_rejected: u64,
    /// GPU-hours the trace asks for (rounded-up sizes, full speed).
    pub demand_gpu_hours: f64,
    /// Seconds from the first to the last arrival after load scaling.
    pub arrival_span_s: u64,
    pub tenants: u64,
    /// The capacity reservations made at the start, largest guarantee first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<SimReservation>,
}

/// A capacity reservation the replay makes at its start.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReservation {
    pub tenant: String,
    pub gpus: u32,
    /// The level of the domain it is pinned to, and the domain's name.
    pub level: Level,
    pub domain: String,
}

/// Why a run could not be set up.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SimError {
    #[error("the fleet has no schedulable nodes")]
    NoNodes,
    #[error("invalid option: {0}")]
    Config(String),
}

impl Simulation {
    /// Prepares `trace` on `fleet` (an expanded fleet file). Jobs use the
    /// first schedulable node's GPU type; nodes of other types are left out.
    pub fn new(
        trace: &Trace,
        fleet: &[FleetNode],
        config: SimConfig,
    ) -> Result<Simulation, SimError> {
        if !(config.load.is_finite() && config.load > 0.0) {
            return Err(SimError::Config(format!(
                "load must be positive, not {}",
                config.load
            )));
        }
        if config.queue_window == 0 {
            return Err(SimError::Config("queue window must be at least 1".into()));
        }
        if !(config.node_failure_rate.is_finite() && config.node_failure_rate >= 0.0) {
            return Err(SimError::Config("node failure rate must be ≥ 0".into()));
        }
        if !(config.estimate_noise.is_finite() && config.estimate_noise >= 0.0) {
            return Err(SimError::Config("estimate noise must be ≥ 0".into()));
        }
        if let Some((t, w)) = config
            .weights
            .iter()
            .find(|(_, w)| !(w.is_finite() && **w > 0.0 && **w <= 1e6))
        {
            return Err(SimError::Config(format!(
                "the weight of tenant {t} must be a positive number, not {w}"
            )));
        }
        if config.queue_window_per_tenant > 1_000_000 {
            return Err(SimError::Config(
                "the per-tenant queue window must be at most 1,000,000".into(),
            ));
        }
        config
            .locality
            .validate()
            .map_err(|e| SimError::Config(e.to_string()))?;
        let gpu_type = fleet
            .iter()
            .find(|n| !n.spare)
            .ok_or(SimError::NoNodes)?
            .gpu_type
            .clone();
        let mut nodes: Vec<FleetNode> = fleet
            .iter()
            .filter(|n| n.gpu_type == gpu_type)
            .cloned()
            .collect();
        nodes.sort_by(|a, b| {
            (&a.spine, &a.leaf, &a.nvlink_domain, &a.node_id).cmp(&(
                &b.spine,
                &b.leaf,
                &b.nvlink_domain,
                &b.node_id,
            ))
        });
        nodes.dedup_by(|a, b| a.node_id == b.node_id);
        if config.spares == SpareMode::Capacity {
            for n in &mut nodes {
                n.spare = false;
            }
        }
        let spare_nodes = nodes.iter().filter(|n| n.spare).count() as u64;
        let node_at: BTreeMap<String, u32> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.node_id.clone(), i as u32))
            .collect();
        let mut leaf_ids: BTreeMap<(&str, &str), u32> = BTreeMap::new();
        let leaf_of: Vec<u32> = nodes
            .iter()
            .map(|n| {
                let next = leaf_ids.len() as u32;
                *leaf_ids.entry((&n.spine, &n.leaf)).or_insert(next)
            })
            .collect();
        let leaves = leaf_ids.len() as u32;
        let failable: Vec<u32> = (0..nodes.len() as u32)
            .filter(|&i| !nodes[i as usize].spare)
            .collect();
        let fleet_gpus: u64 = failable
            .iter()
            .map(|&i| u64::from(nodes[i as usize].gpus))
            .sum();
        let node_gpus = failable
            .iter()
            .map(|&i| nodes[i as usize].gpus)
            .max()
            .unwrap_or(0);
        if node_gpus == 0 {
            return Err(SimError::NoNodes);
        }
        let mut scheduled_failures = Vec::new();
        for (at, node) in &config.scheduled_failures {
            let &i = node_at.get(node).ok_or_else(|| {
                SimError::Config(format!("scheduled failure on unknown node {node:?}"))
            })?;
            scheduled_failures.push((*at, i));
        }

        let selected = &trace.jobs[..config.max_jobs.unwrap_or(usize::MAX).min(trace.jobs.len())];
        let mut tenant_at: BTreeMap<&str, u32> = BTreeMap::new();
        for j in selected {
            tenant_at.entry(&j.tenant).or_insert(0);
        }
        // Tenant indices in name order, so they do not depend on the trace's order.
        for (i, v) in tenant_at.values_mut().enumerate() {
            *v = i as u32;
        }
        let tenants: Vec<String> = tenant_at.keys().map(|t| t.to_string()).collect();
        let shares: Vec<f64> = tenants
            .iter()
            .map(|t| config.entitlements.as_ref().map_or(0.0, |e| e.share(t)))
            .collect();
        let mut guarantees: Vec<u64> = shares
            .iter()
            .map(|&s| (s * fleet_gpus as f64).floor() as u64)
            .collect();
        let reserved = reserve(&config, &nodes, &tenants, &guarantees, node_gpus, &gpu_type)?;
        let mut reservation_of = vec![None; tenants.len()];
        for (i, (r, t)) in reserved.iter().enumerate() {
            reservation_of[*t as usize] = Some(i as u32);
            // What a tenant reserves comes out of its guarantee of the
            // shared pool: the two together are what it was promised.
            guarantees[*t as usize] -= u64::from(r.gpus);
        }
        let reserved: Vec<ReservedCapacity> = reserved.into_iter().map(|(r, _)| r).collect();
        let in_reserved_domain: Vec<bool> = (nodes.iter())
            .map(|n| {
                let node = as_node(n);
                reserved.iter().any(|r| r.holds(&node))
            })
            .collect();
        let quotas: Vec<Option<u32>> = shares
            .iter()
            .zip(&guarantees)
            .map(|(&s, &g)| (config.quota_caps && s > 0.0).then_some(g as u32))
            .collect();
        let weights: Vec<u32> = tenants
            .iter()
            .map(|t| {
                let w = config.weights.get(t).copied().unwrap_or(1.0);
                ((w * 1000.0).round() as u32).max(1)
            })
            .collect();

        let mut capacity = Capacity::new(&nodes);
        let first = selected.first().map_or(0, |j| j.submit_unix_s);
        let mut summary = WorkloadSummary {
            jobs: selected.len() as u64,
            skipped_rows: trace.skipped.total(),
            gpu_type: gpu_type.clone(),
            nodes: failable.len() as u64,
            spare_nodes,
            spares: config.spares,
            fleet_gpus,
            node_gpus,
            tenants: tenants.len() as u64,
            reservations: (reserved.iter())
                .map(|r| SimReservation {
                    tenant: r.tenant.clone(),
                    gpus: r.gpus,
                    level: r.level,
                    domain: r.path.last().cloned().unwrap_or_else(|| "region".into()),
                })
                .collect(),
            ..WorkloadSummary::default()
        };
        let mut jobs = Vec::with_capacity(selected.len());
        for (i, j) in selected.iter().enumerate() {
            let (workers, gpus_per_worker) = if j.gpus <= node_gpus {
                (1, j.gpus)
            } else {
                (j.gpus.div_ceil(node_gpus), node_gpus)
            };
            if workers * gpus_per_worker != j.gpus {
                summary.jobs_rounded_up += 1;
            }
            let submit = ((j.submit_unix_s - first) as f64 / config.load).floor() as u64;
            let est_work = if config.estimate_noise > 0.0 {
                let mut g = SimRng::derive(config.seed, STREAM_ESTIMATES, i as u64);
                j.duration_s * (config.estimate_noise * g.normal()).exp()
            } else {
                j.duration_s
            };
            let tenant = tenant_at[j.tenant.as_str()];
            let best = capacity.best_level(workers, gpus_per_worker);
            let gpus = u64::from(workers) * u64::from(gpus_per_worker);
            let rejected =
                best.is_none() || quotas[tenant as usize].is_some_and(|q| gpus > u64::from(q));
            summary.jobs_rejected += u64::from(rejected);
            summary.demand_gpu_hours += gpus as f64 * j.duration_s / 3600.0;
            summary.arrival_span_s = submit;
            jobs.push(JobSpec {
                tenant,
                submit,
                work: j.duration_s,
                est_work,
                workers,
                gpus_per_worker,
                best: best.unwrap_or(Level::Region),
                priority: if config.low_priority_tenants.contains(&j.tenant) {
                    gangway_shared::api::Priority::Low.rank()
                } else {
                    gangway_shared::api::Priority::Normal.rank()
                },
                rejected,
            });
        }
        Ok(Simulation {
            config,
            gpu_type,
            nodes,
            node_at,
            leaf_of,
            leaves,
            failable,
            scheduled_failures,
            fleet_gpus,
            tenants,
            shares,
            guarantees,
            weights,
            quotas,
            reserved,
            reservation_of,
            in_reserved_domain,
            jobs,
            summary,
        })
    }

    /// What is being replayed.
    pub fn summary(&self) -> &WorkloadSummary {
        &self.summary
    }

    /// Tenant `i`'s name (as [`crate::PlacementRecord::tenant`] numbers them).
    pub fn tenant_name(&self, i: u32) -> &str {
        &self.tenants[i as usize]
    }

    /// The GPU type the simulated fleet runs.
    pub fn gpu_type(&self) -> &str {
        &self.gpu_type
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }
}

/// The capacity reservations of [`SimConfig::reserve_pct`], each with its
/// tenant's index: the tenants with the largest guarantees (then by name)
/// each reserve their guarantee, the last one what is left of the share, in
/// whole nodes, until the reservations cover the share of the fleet's GPUs
/// (rounded to whole nodes). Each is open-ended from the start, at the
/// lowest level one domain of which can hold it, pinned to a domain by
/// [`admit`] as the region pins one (the next level up when no domain of
/// that level has room left; a tenant is skipped when none has).
fn reserve(
    config: &SimConfig,
    nodes: &[FleetNode],
    tenants: &[String],
    guarantees: &[u64],
    node_gpus: u32,
    gpu_type: &str,
) -> Result<Vec<(ReservedCapacity, u32)>, SimError> {
    let pct = config.reserve_pct;
    if pct == 0.0 {
        return Ok(Vec::new());
    }
    if !(pct.is_finite() && pct > 0.0 && pct <= 100.0) {
        return Err(SimError::Config(format!(
            "the reserved share must be a percentage in (0, 100], not {pct}"
        )));
    }
    if config.entitlements.is_none() {
        return Err(SimError::Config(
            "reservations are made from the tenants' guarantees: give them (--quotas)".into(),
        ));
    }
    if config.quota_caps {
        return Err(SimError::Config(
            "reservations and hard quotas do not combine yet".into(),
        ));
    }
    let in_service: Vec<Node> = nodes.iter().filter(|n| !n.spare).map(as_node).collect();
    let fleet_gpus: u64 = in_service.iter().map(|n| u64::from(n.gpus)).sum();
    let node = u64::from(node_gpus);
    let share = (pct / 100.0 * fleet_gpus as f64 / node as f64).round() as u64 * node;
    let mut by_guarantee: Vec<usize> = (0..tenants.len()).collect();
    by_guarantee.sort_by_key(|&t| (std::cmp::Reverse(guarantees[t]), t));
    let mut capacity = Capacity::new(nodes);
    let mut promised: Vec<Promised> = Vec::new();
    let mut out = Vec::new();
    let mut total = 0;
    for t in by_guarantee {
        let gpus = guarantees[t].min(share - total) / node * node;
        if gpus == 0 {
            break;
        }
        let lowest = capacity
            .best_level((gpus / node) as u32, node_gpus)
            .unwrap_or(Level::Region);
        let admitted = (Level::ALL.into_iter().filter(|&l| l >= lowest)).find_map(|level| {
            let ask = Ask {
                gpus: gpus as u32,
                level,
                start: 0,
                end: None,
            };
            match admit(&in_service, &promised, &ask) {
                Admission::Admitted { domain } => Some(domain),
                Admission::Refused { .. } => None,
            }
        });
        let Some(domain) = admitted else { continue };
        promised.push(Promised {
            gpus: gpus as u32,
            domain: domain.clone(),
            start: 0,
            end: None,
        });
        out.push((
            ReservedCapacity {
                id: format!("reserved-{}", tenants[t]),
                tenant: tenants[t].clone(),
                gpu_type: gpu_type.to_string(),
                gpus: gpus as u32,
                level: domain.level,
                path: domain.path,
                start: 0,
                end: None,
            },
            t as u32,
        ));
        total += gpus;
    }
    Ok(out)
}

/// `n` as the scheduler sees it in the empty fleet.
fn as_node(n: &FleetNode) -> Node {
    Node {
        id: n.node_id.clone(),
        spine: n.spine.clone(),
        leaf: n.leaf.clone(),
        nvlink_domain: n.nvlink_domain.clone(),
        gpu_type: n.gpu_type.clone(),
        gpus: n.gpus,
        free: (0..n.gpus).collect(),
        schedulable: !n.spare,
    }
}

/// The largest number of `g`-GPU workers one domain of each level can hold
/// in the empty fleet, memoized per worker size.
struct Capacity<'a> {
    nodes: &'a [FleetNode],
    by_size: BTreeMap<u32, [u64; 4]>,
}

impl<'a> Capacity<'a> {
    fn new(nodes: &'a [FleetNode]) -> Capacity<'a> {
        Capacity {
            nodes,
            by_size: BTreeMap::new(),
        }
    }

    /// The tightest level with a domain that holds `workers` workers of `g`
    /// GPUs, or `None` when even the whole fleet cannot.
    fn best_level(&mut self, workers: u32, g: u32) -> Option<Level> {
        let nodes = self.nodes;
        let caps = self.by_size.entry(g).or_insert_with(|| {
            let mut out = [0u64; 4];
            for level in Level::ALL {
                // A domain is known by its whole path (two spines may both
                // name a leaf `rack-a`).
                let mut per_domain: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
                for n in nodes.iter().filter(|n| !n.spare) {
                    let (s, l, d) = (n.spine.as_str(), n.leaf.as_str(), n.nvlink_domain.as_str());
                    let key = match level {
                        Level::Nvlink => (s, l, d),
                        Level::Leaf => (s, l, ""),
                        Level::Spine => (s, "", ""),
                        Level::Region => ("", "", ""),
                    };
                    *per_domain.entry(key).or_default() += u64::from(n.gpus / g);
                }
                out[level as usize] = per_domain.values().copied().max().unwrap_or(0);
            }
            out
        });
        Level::ALL
            .into_iter()
            .find(|&l| caps[l as usize] >= u64::from(workers))
    }
}
