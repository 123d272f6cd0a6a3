//! The regional control plane's configuration.

use std::net::SocketAddr;
use std::time::Duration;

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
    /// How often a replica that is not the leader tries to become it.
    pub leader_retry_interval: Duration,
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
            auth: None,
        }
    }
}
