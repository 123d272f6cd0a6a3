//! The regional control plane's configuration.

use std::net::SocketAddr;
use std::time::Duration;

use gangway_auth::jwt::SigningKey;
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
    /// The agents' lease: an agent with no successful sync for this long
    /// fences itself (checkpoints and stops its workers, starts nothing)
    /// before the region may declare its nodes lost and release their GPUs
    /// (`health.lost_after_s`). `None`: derived, see [`RegionConfig::fencing`].
    pub fence_after: Option<Duration>,
    /// How long a fenced worker has to checkpoint before its agent stops
    /// it anyway. `None`: derived, see [`RegionConfig::fencing`].
    pub fence_checkpoint: Option<Duration>,
    /// Verifies the tokens of callers (the global tier, agents). `None`
    /// lets anyone in: only for benchmarks and `--insecure-no-auth`. What
    /// the region starts with: [`AppState::credentials`](crate::AppState)
    /// holds the one in use, which SIGHUP may replace.
    pub auth: Option<gangway_auth::jwt::Verifier>,
    /// The other regions, the lease, and when a silent region is adopted
    /// (`loops/beat.rs`). No peers: a region alone, never fenced.
    pub peers: PeerConfig,
    /// The region's checkpoint store (`--checkpoint-store`, the same URL
    /// its agents are given). With one, a checkpoint an agent reports is
    /// recorded only once its manifest is read back from the store and
    /// matches; `None` records what agents report (each restoring agent
    /// still verifies every file).
    pub checkpoint_store: Option<gangway_checkpoint::CheckpointStore>,
    /// The API's TLS: the region's certificate chain and key, served with
    /// rustls to the global tier, agents and peers. `None`: plain HTTP,
    /// which `gangway region` allows only behind `--insecure-http`. A clone
    /// held elsewhere rotates the certificate in place
    /// (`reload_from_config`: new connections get the new one, open ones
    /// carry on): `gangway region` does so on SIGHUP.
    pub tls: Option<axum_server::tls_rustls::RustlsConfig>,
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
            fence_after: None,
            fence_checkpoint: None,
            auth: None,
            peers: PeerConfig::default(),
            checkpoint_store: None,
            tls: None,
        }
    }

    /// The agents' lease and the fenced workers' checkpoint time, checked
    /// against the health policy's `lost_after_s` (L): an agent cut off from
    /// the region must have stopped its workers before the region releases
    /// their GPUs, so `fence_after + fence_checkpoint < L` is required, and
    /// the lease must outlast a few syncs (`fence_after >= 3 ×
    /// agent_sync_interval`). Defaults: `fence_after` = L − 30 s (L / 2
    /// when L < 60 s); `fence_checkpoint` = two thirds of what is left
    /// below L, at most 20 s. With the defaults (L = 120 s): fence at
    /// 90 s, workers stopped by 110 s, GPUs released at 120 s. A region
    /// with peers defaults to the regions' lease and at most 6 s instead
    /// (8 s and 6 s: a dead region's jobs are adopted after 16 s).
    pub fn fencing(&self) -> Result<Fencing, String> {
        let lost = Duration::from_secs(self.health.lost_after_s);
        // With peers, a dead region's jobs are adopted once its agents
        // have surely stopped its workers: the agents' lease defaults to
        // the regions' lease (and a short checkpoint time), so adoption
        // comes within about 16 s of the death rather than minutes.
        let multi_region = !self.peers.peers.is_empty();
        let fence_after = self.fence_after.unwrap_or(if multi_region {
            self.peers.lease
        } else if lost >= Duration::from_secs(60) {
            lost - Duration::from_secs(30)
        } else {
            lost / 2
        });
        if fence_after.is_zero() {
            return Err("the agents' lease (--fence-after-s) must be above zero".into());
        }
        let fence_checkpoint = self.fence_checkpoint.unwrap_or_else(|| {
            let cap = Duration::from_secs(if multi_region { 6 } else { 20 });
            (lost.saturating_sub(fence_after) * 2 / 3).min(cap)
        });
        if fence_after + fence_checkpoint >= lost {
            return Err(format!(
                "the health policy's lost_after_s ({} s) must exceed the agents' lease (--fence-after-s, {} s) plus the fenced workers' checkpoint time (--fence-checkpoint-s, {} s): a cut-off agent must have stopped its workers before the region releases their GPUs",
                lost.as_secs_f64(),
                fence_after.as_secs_f64(),
                fence_checkpoint.as_secs_f64()
            ));
        }
        if fence_after < self.agent_sync_interval * 3 {
            return Err(format!(
                "the agents' lease (--fence-after-s, {} s) must be at least three sync intervals ({} s)",
                fence_after.as_secs_f64(),
                (self.agent_sync_interval * 3).as_secs_f64()
            ));
        }
        Ok(Fencing {
            fence_after,
            fence_checkpoint,
        })
    }

    /// Checks what the region cannot run with safely (start-up refuses it).
    pub fn validate(&self) -> Result<(), String> {
        if self.health.suspect_after_s >= self.health.lost_after_s {
            return Err(
                "the health policy's suspect_after_s must be less than lost_after_s".into(),
            );
        }
        let fencing = self.fencing()?;
        let p = &self.peers;
        if !p.peers.is_empty() {
            if p.lease < p.heartbeat_interval * 3 {
                return Err(format!(
                    "the regions' lease (--peer-lease-s, {} s) must be at least three heartbeats ({} s)",
                    p.lease.as_secs_f64(),
                    (p.heartbeat_interval * 3).as_secs_f64()
                ));
            }
            let least = self.least_adopt_after(&fencing);
            if let Some(a) = p.adopt_after.filter(|a| *a < least) {
                return Err(format!(
                    "--adopt-after-s ({} s) must exceed the time a dead region's workers may \
                     still run: the longer of the regions' lease ({} s) and the agents' lease \
                     ({} s), plus the fenced checkpoint time ({} s), plus 2 s: at least {} s",
                    a.as_secs_f64(),
                    p.lease.as_secs_f64(),
                    fencing.fence_after.as_secs_f64(),
                    fencing.fence_checkpoint.as_secs_f64(),
                    least.as_secs_f64()
                ));
            }
            if p.signing_key.is_none() && self.auth.is_some() {
                return Err(
                    "a region with peers needs --peer-signing-key (the key that signs the \
                     service tokens it calls its peers with)"
                        .into(),
                );
            }
            // With the cloud's CA, every peer is called over HTTPS.
            if p.ca_pem.is_some() {
                for peer in &p.peers {
                    let what = format!("--peer {}", peer.name);
                    gangway_shared::client::check_internal_url(&peer.url, true, false, &what)?;
                }
            }
        }
        if let Some(pem) = &p.ca_pem {
            gangway_shared::client::internal_client(reqwest::Client::builder(), Some(pem))
                .map_err(|e| format!("the peers' CA (--ca): {e}"))?;
        }
        Ok(())
    }

    /// The shortest safe [`PeerConfig::adopt_after`]: a dead
    /// region's workers have stopped by then, whether their region fenced
    /// itself (the regions' lease, then the fenced checkpoint time) or their
    /// agents did (the agents' lease, then the same), plus 2 s of margin for
    /// clocks and beats.
    fn least_adopt_after(&self, fencing: &Fencing) -> Duration {
        self.peers.lease.max(fencing.fence_after)
            + fencing.fence_checkpoint
            + Duration::from_secs(2)
    }

    /// When a region silent to a majority is adopted: as configured, or the
    /// shortest safe time.
    pub fn adopt_after(&self) -> Duration {
        let least = self
            .fencing()
            .map(|f| self.least_adopt_after(&f))
            .unwrap_or(Duration::from_secs(60));
        self.peers.adopt_after.unwrap_or(least)
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

/// The agents' lease (see [`RegionConfig::fencing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fencing {
    /// An agent with no successful sync for this long fences itself.
    pub fence_after: Duration,
    /// A fenced worker's time to checkpoint before it is stopped.
    pub fence_checkpoint: Duration,
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

/// Another region, as `NAME=URL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub url: String,
}

/// How this region watches its peers.
#[derive(Clone)]
pub struct PeerConfig {
    pub peers: Vec<Peer>,
    /// Signs the service tokens this region calls its peers with.
    pub signing_key: Option<SigningKey>,
    pub heartbeat_interval: Duration,
    /// Without a round trip to a majority for this long, a region fences.
    pub lease: Duration,
    /// A region silent to a majority for this long is adopted. `None`:
    /// derived ([`crate::RegionConfig::adopt_after`]).
    pub adopt_after: Option<Duration>,
    /// A queued job that has waited this long here goes to its buddy when
    /// the buddy has room for it now (`loops/evacuation.rs`, balancing).
    /// `None`: jobs stay where they were submitted.
    pub balance_after: Option<Duration>,
    /// The CA (PEM) that signs the peers' certificates: calls to peers
    /// trust it alone and go over HTTPS only. `None`: plain HTTP to peers
    /// (`--insecure-http`).
    pub ca_pem: Option<String>,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            peers: Vec::new(),
            signing_key: None,
            heartbeat_interval: Duration::from_secs(1),
            lease: Duration::from_secs(8),
            adopt_after: None,
            balance_after: Some(Duration::from_secs(60)),
            ca_pem: None,
        }
    }
}

impl PeerConfig {
    /// How many regions make a majority (this one included).
    pub fn majority(&self) -> usize {
        self.peers.len().div_ceil(2) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RegionConfig {
        RegionConfig::new("r", SocketAddr::from(([127, 0, 0, 1], 0)), "")
    }

    #[test]
    fn the_default_lease_ends_with_time_to_checkpoint_before_lost() {
        let f = config().fencing().unwrap();
        assert_eq!(f.fence_after, Duration::from_secs(90));
        assert_eq!(f.fence_checkpoint, Duration::from_secs(20));
        let mut short = config();
        short.health.lost_after_s = 12;
        short.agent_sync_interval = Duration::from_millis(200);
        let f = short.fencing().unwrap();
        assert_eq!(f.fence_after, Duration::from_secs(6));
        assert_eq!(f.fence_checkpoint, Duration::from_secs(4));
    }

    #[test]
    fn a_lease_that_outlasts_lost_after_is_refused() {
        let mut c = config();
        c.fence_after = Some(Duration::from_secs(110));
        c.fence_checkpoint = Some(Duration::from_secs(10));
        let e = c.validate().unwrap_err();
        assert!(e.contains("lost_after_s (120 s) must exceed"), "{e}");
        c.fence_after = Some(Duration::from_secs(100));
        c.fence_checkpoint = Some(Duration::from_secs(19));
        assert!(c.validate().is_ok());
        c.fence_after = Some(Duration::from_secs(2));
        let e = c.validate().unwrap_err();
        assert!(e.contains("three sync intervals"), "{e}");
    }
}
