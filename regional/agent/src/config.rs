//! The agent's configuration.

use std::collections::BTreeMap;
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

/// How real workers are kept apart from each other and from the agent
/// (docs/jobs.md, "What a job can see").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IsolationMode {
    /// `sandbox` where the agent runs as root with bubblewrap and setpriv
    /// installed, `user` (with a warning) where it runs as root without
    /// them; refused where it does not run as root.
    #[default]
    Auto,
    /// Each worker in a bubblewrap sandbox (its own PID namespace and
    /// `/tmp`, the system read-only, only its own directories writable)
    /// as its tenant's unprivileged user.
    Sandbox,
    /// Each worker as its tenant's unprivileged user, without a sandbox.
    User,
    /// Workers run as the agent's own user, with its files in reach:
    /// insecure, for a single-user machine only.
    Off,
}

impl IsolationMode {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "auto" => IsolationMode::Auto,
            "sandbox" => IsolationMode::Sandbox,
            "user" => IsolationMode::User,
            "off" => IsolationMode::Off,
            _ => return None,
        })
    }
}

/// A path of the machine bound into every sandbox at the same place: a
/// shared dataset or scratch volume the operator mounts for jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxBind {
    pub path: PathBuf,
    pub writable: bool,
}

/// What real workers may touch (real executor only).
#[derive(Clone, Debug, Default)]
pub struct IsolationConfig {
    pub mode: IsolationMode,
    /// Tenant → an existing user its workers run as, instead of the
    /// system user the agent creates for it on first use (`gw-{tenant}`).
    pub tenant_users: BTreeMap<String, String>,
    /// Shared paths bound into every sandbox.
    pub binds: Vec<SandboxBind>,
    /// More paths sandboxed workers see as empty (the agent's work
    /// directory and a local checkpoint store always are).
    pub hide: Vec<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The region's base URL, for example `https://region.example:7001`.
    pub region_url: String,
    /// The CA (PEM) that signs the region's certificate: calls to the
    /// region trust it alone and go over HTTPS only. `None`: plain HTTP
    /// (`gangway agent --insecure-http`).
    pub region_ca_pem: Option<String>,
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
    /// Real only: what workers run as and may touch.
    pub isolation: IsolationConfig,
}

/// A configuration the agent cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "agent_id {0:?} is empty or has characters other than letters, digits, '.', '_' and '-'"
    )]
    AgentId(String),
    #[error("{0}")]
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
        // With the region's CA, the region is called over HTTPS only.
        let url = &self.region_url;
        match &self.region_ca_pem {
            Some(_) => gangway_shared::client::check_internal_url(url, true, false, "region_url")
                .map_err(ConfigError::RegionUrl)?,
            None if url.starts_with("http://") || url.starts_with("https://") => {}
            None => {
                return Err(ConfigError::RegionUrl(format!(
                    "region_url {url:?} is not an http(s) URL"
                )))
            }
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
