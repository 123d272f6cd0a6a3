//! The agent's configuration.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use gangway_shared::agent::AgentNode;

/// How the agent runs workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// Real processes, one process group per worker.
    Real,
    /// No processes: a worker "runs" for its scaled estimated duration.
    Sim,
}

impl ExecutorKind {
    /// The name the region knows this executor by (`real` or `sim`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Real => "real",
            ExecutorKind::Sim => "sim",
        }
    }
}

impl fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The region's base URL, for example `http://127.0.0.1:7001`.
    pub region_url: String,
    /// This agent's stable name; letters, digits, `.`, `_` and `-` only, as
    /// it appears in URL paths.
    pub agent_id: String,
    /// The nodes this agent serves.
    pub nodes: Vec<AgentNode>,
    pub executor: ExecutorKind,
    /// Sim only: a job of `estimated_duration_s` runs
    /// `estimated_duration_s * time_factor` seconds, and `max_duration_s` is
    /// scaled the same way. Finite and not negative.
    pub time_factor: f64,
    /// Real only: each worker runs in
    /// `work_dir/jobs/{job_id}/rank-{rank}-attempt-{attempt}` and logs there.
    pub work_dir: PathBuf,
    /// How often to sync when the region's register answer names no
    /// interval (`sync_interval_ms` = 0).
    pub default_sync_interval: Duration,
    /// The agent token (role agent, naming the region) presented to the
    /// region; `None` for a region that runs without authentication.
    pub token: Option<String>,
    /// The machine boot id reported for the agent's nodes. `None`: the
    /// kernel's (`/proc/sys/kernel/random/boot_id`) for the real executor,
    /// one made up at each agent start for the sim executor (a restarted
    /// sim agent is a rebooted simulated fleet).
    pub machine_boot_id: Option<String>,
    /// How often GPU health is polled through NVML (real executor, one
    /// node, NVML present); XID events are waited for in between.
    pub health_poll_interval: Duration,
    /// The agent's own lease: with no successful sync for this long it
    /// fences (checkpoints and stops its workers, starts nothing until it
    /// syncs again). The region names one at registration; the shorter of
    /// the two applies. `None` and a region naming none: never fences.
    pub fence_after: Option<Duration>,
    /// Real only: the region's checkpoint store (`file:///path`,
    /// `s3://bucket/prefix`), the same URL the region is given. Rank 0's
    /// checkpoints are uploaded there and restores fetched from there.
    /// `None`: `work_dir/checkpoint-store`, which serves only restarts on
    /// this machine.
    pub checkpoint_store: Option<String>,
}

/// A configuration the agent cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "agent_id {0:?} is empty or has characters other than letters, digits, '.', '_' and '-'"
    )]
    AgentId(String),
    #[error("region_url {0:?} is not an http(s) URL")]
    RegionUrl(String),
    #[error("time_factor {0} is not a finite number >= 0")]
    TimeFactor(f64),
    #[error("default_sync_interval is zero")]
    SyncInterval,
    #[error("health_poll_interval is zero")]
    HealthPollInterval,
    #[error("fence_after is zero")]
    FenceAfter,
}

impl AgentConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let id_ok = !self.agent_id.is_empty()
            && self
                .agent_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !id_ok {
            return Err(ConfigError::AgentId(self.agent_id.clone()));
        }
        if !(self.region_url.starts_with("http://") || self.region_url.starts_with("https://")) {
            return Err(ConfigError::RegionUrl(self.region_url.clone()));
        }
        if !self.time_factor.is_finite() || self.time_factor < 0.0 {
            return Err(ConfigError::TimeFactor(self.time_factor));
        }
        if self.default_sync_interval.is_zero() {
            return Err(ConfigError::SyncInterval);
        }
        if self.health_poll_interval.is_zero() {
            return Err(ConfigError::HealthPollInterval);
        }
        if self.fence_after.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::FenceAfter);
        }
        Ok(())
    }
}
