//! The regional control plane's configuration.

use std::net::SocketAddr;
use std::time::Duration;

use gangway_sched::{Policy, PreemptionPolicy};

#[derive(Clone)]
pub struct RegionConfig {
    /// The region's name, for example `us-east`.
    pub region: String,
    /// Where the API listens.
    pub listen: SocketAddr,
    /// libpq-style connection string of the region's PostgreSQL primary.
    pub database_url: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// Longest time between scheduling passes; submissions and freed GPUs
    /// wake the loop sooner.
    pub schedule_interval: Duration,
    /// How often agents sync (heartbeat, reports, assignments).
    pub agent_sync_interval: Duration,
    /// Nodes of an agent silent for this long take no new work.
    pub agent_timeout: Duration,
    /// Time between SIGTERM and SIGKILL when a worker is stopped.
    pub grace_period: Duration,
    /// Time a worker asked to checkpoint has before it is stopped anyway.
    pub checkpoint_deadline: Duration,
    /// When the scheduler preempts running work for waiting work (priority,
    /// and tenants taking back their guarantees). Its
    /// `checkpoint_deadline_s` is ignored: [`RegionConfig::checkpoint_deadline`]
    /// is the one deadline workers get and the planner assumes.
    pub preemption: PreemptionPolicy,
    /// Half-life of the decayed past usage fair sharing counts: usage this
    /// long ago weighs half as much as usage now.
    pub fair_share_half_life: Duration,
    /// How long the decayed usage, read from the allocation intervals, is
    /// reused before it is read again (it moves slowly).
    pub fair_share_refresh: Duration,
    /// How often a replica that is not the leader tries to become it.
    pub leader_retry_interval: Duration,
    /// The node-health policy: which signals quarantine a GPU, drain a node
    /// or send it to repair, and when a silent node is suspect, then lost
    /// (`gangway region --health-policy FILE`, TOML; defaults from
    /// NVIDIA's XID guidance, see docs/operations.md).
    pub health: gangway_health::HealthPolicy,
    /// How often the leader lets time pass for nodes (silent nodes turn
    /// suspect then lost, hold-downs and drain deadlines end) and carries
    /// out what their state decides.
    pub health_tick_interval: Duration,
    /// Verifies the tokens of callers (the global tier, agents). `None`
    /// lets anyone in: only for benchmarks and `--insecure-no-auth`.
    pub auth: Option<gangway_auth::jwt::Verifier>,
}

impl RegionConfig {
    /// Defaults for a region named `region` using `database_url`.
    pub fn new(region: &str, listen: SocketAddr, database_url: &str) -> Self {
        RegionConfig {
            region: region.to_string(),
            listen,
            database_url: database_url.to_string(),
            pool_size: 16,
            schedule_interval: Duration::from_millis(500),
            agent_sync_interval: Duration::from_millis(1000),
            agent_timeout: Duration::from_secs(15),
            grace_period: Duration::from_secs(10),
            checkpoint_deadline: Duration::from_secs(120),
            leader_retry_interval: Duration::from_secs(1),
            health: gangway_health::HealthPolicy::default(),
            health_tick_interval: Duration::from_secs(1),
            preemption: PreemptionPolicy::default(),
            fair_share_half_life: Duration::from_secs(24 * 3600),
            fair_share_refresh: Duration::from_secs(10),
            auth: None,
        }
    }

    /// What every planning pass of this region (scheduling, explain,
    /// dry run) runs with.
    pub fn planning(&self) -> Planning {
        let mut preemption = self.preemption.clone();
        preemption.checkpoint_deadline_s = self.checkpoint_deadline.as_secs();
        Planning {
            agent_timeout: self.agent_timeout,
            policy: Policy {
                preemption,
                ..Policy::default()
            },
            history: HistoryOptions {
                half_life: self.fair_share_half_life,
                refresh: self.fair_share_refresh,
            },
        }
    }
}

/// The inputs of a planning pass that come from configuration.
#[derive(Clone, Debug)]
pub struct Planning {
    /// Nodes of an agent silent for this long take no new work.
    pub agent_timeout: Duration,
    /// The scheduler core's knobs.
    pub policy: Policy,
    /// How past usage is decayed for fair sharing.
    pub history: HistoryOptions,
}

impl Planning {
    /// The defaults of [`RegionConfig::new`] with this agent timeout.
    pub fn with_agent_timeout(agent_timeout: Duration) -> Planning {
        let mut p = RegionConfig::new("", SocketAddr::from(([127, 0, 0, 1], 0)), "").planning();
        p.agent_timeout = agent_timeout;
        p
    }
}

/// How the snapshot computes each tenant's decayed past usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Usage this long ago counts half as much as usage now. Intervals
    /// released more than ten half-lives ago (under 0.1 % weight) are not
    /// read.
    pub half_life: Duration,
    /// Reuse a computed history for this long; zero = read it every time.
    pub refresh: Duration,
}
