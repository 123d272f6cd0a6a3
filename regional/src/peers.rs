//! Regions watching each other (docs/failover.md).
//!
//! Every region heartbeats every peer over HTTPS each
//! [`PeerConfig::heartbeat_interval`]; a heartbeat carries what the sender
//! last heard from every region, and the answer what the receiver did.
//! Both ends record it in `peer_leases`, on the database's clock:
//!
//! - **Fencing.** A region without a successful round trip to a majority of
//!   the regions (itself included) for [`PeerConfig::lease`] fences itself:
//!   it places nothing, refuses new jobs, and asks its running jobs to
//!   checkpoint and stop within the fenced checkpoint time. It unfences
//!   once it reaches a majority again, after it has learned which of its
//!   jobs were adopted elsewhere meanwhile and released them.
//! - **Adoption** (`replication/mod.rs`, `store/replicas.rs`). A region holding another's job
//!   intent (its buddy) adopts that region's live jobs only when it is not
//!   fenced itself and a majority of the regions — it and peers it reaches
//!   — have heard nothing from the dead one for [`PeerConfig::adopt_after`],
//!   which is longer than the dead region's lease plus the time its
//!   workers have to stop (fenced by their region, or by their agents'
//!   own lease when the region process is gone). A region heard from by a
//!   majority is never adopted, so a job never runs in two regions.
//! - **Replication** of job intent happens on each create (synchronous,
//!   `api/jobs.rs`); what comes after (a job ended, a new checkpoint) is
//!   sent by a loop of its own ([`run_loop`]), so that a large checkpoint
//!   copy never holds up a heartbeat.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gangway_auth::jwt::{claims_for, Role, SigningKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::api::AppState;

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
    /// the buddy has room for it now (`crate::evacuation`, balancing).
    /// `None`: jobs stay where they were submitted.
    pub balance_after: Option<Duration>,
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
        }
    }
}

impl PeerConfig {
    /// How many regions make a majority (this one included).
    pub fn majority(&self) -> usize {
        (self.peers.len() + 1) / 2 + 1
    }
}

/// A heartbeat, and its answer: who sends it, and seconds since the sender
/// last heard from each region it knows (or since it started, if never).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub from: String,
    pub silent_s: BTreeMap<String, f64>,
}

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("no peer region named {0:?}")]
    Unknown(String),
    #[error("cannot reach region {peer}: {source}")]
    Transport {
        peer: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("region {peer} answered {status}: {body}")]
    Refused {
        peer: String,
        status: u16,
        body: String,
    },
}

/// The peers, a client to call them, and whether this region is fenced.
pub struct Peers {
    pub config: PeerConfig,
    /// [`PeerConfig::adopt_after`], resolved.
    pub adopt_after: Duration,
    http: reqwest::Client,
    token: Mutex<Option<(String, Instant)>>,
    fenced: AtomicBool,
    /// Until when the round trips the last beat found keep a majority
    /// fresh (`None`: they did not). Past it, the region fences, whether
    /// or not a beat runs to notice (see [`watchdog`]).
    majority_until: Mutex<Option<Instant>>,
    /// Replicas in this process made no round trip before this.
    pub started: Instant,
}

const TOKEN_TTL: Duration = Duration::from_secs(600);

impl Peers {
    pub fn new(config: PeerConfig, adopt_after: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a plain HTTP client builds");
        // A region with peers starts fenced: it has not reached a majority
        // yet (the first beat tells).
        let fenced = !config.peers.is_empty();
        Peers {
            config,
            adopt_after,
            http,
            token: Mutex::new(None),
            fenced: AtomicBool::new(fenced),
            majority_until: Mutex::new(None),
            started: Instant::now(),
        }
    }

    /// Whether the majority the last beat saw has run out (or it saw none).
    fn majority_lost(&self) -> bool {
        let until = *self.majority_until.lock().expect("majority lock");
        until.is_none_or(|t| Instant::now() >= t)
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Relaxed)
    }

    pub(crate) fn set_fenced(&self, fenced: bool) -> bool {
        self.fenced.swap(fenced, Ordering::Relaxed)
    }

    /// The peers' names, in configuration order.
    pub fn names(&self) -> Vec<&str> {
        self.config.peers.iter().map(|p| p.name.as_str()).collect()
    }

    /// Seconds since this replica started watching its peers.
    pub fn uptime_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub fn peer(&self, name: &str) -> Option<&Peer> {
        self.config.peers.iter().find(|p| p.name == name)
    }

    fn token(&self) -> Option<String> {
        let key = self.config.signing_key.as_ref()?;
        let mut t = self.token.lock().expect("token lock");
        if let Some((token, renew_at)) = t.as_ref() {
            if Instant::now() < *renew_at {
                return Some(token.clone());
            }
        }
        let claims = claims_for(
            Role::Service,
            "gangway-region",
            None,
            None,
            gangway_shared::tokens::ISSUER,
            gangway_shared::tokens::REGION_AUDIENCE,
            TOKEN_TTL,
        );
        let token = key.sign(&claims).expect("signing with a loaded key");
        *t = Some((token.clone(), Instant::now() + TOKEN_TTL / 2));
        Some(token)
    }

    /// POSTs `body` to `path` of peer `name` and reads its JSON answer.
    pub async fn post<B: Serialize, R: DeserializeOwned>(
        &self,
        name: &str,
        path: &str,
        body: &B,
    ) -> Result<R, PeerError> {
        let peer = self
            .peer(name)
            .ok_or_else(|| PeerError::Unknown(name.to_string()))?;
        let mut req = self
            .http
            .post(format!("{}{path}", peer.url.trim_end_matches('/')))
            .json(body);
        if let Some(t) = self.token() {
            req = req.bearer_auth(t);
        }
        let transport = |source| PeerError::Transport {
            peer: name.to_string(),
            source,
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(PeerError::Refused {
                peer: name.to_string(),
                status: status.as_u16(),
                body: resp.text().await.unwrap_or_default(),
            });
        }
        resp.json().await.map_err(transport)
    }

    /// POSTs raw bytes to `path?query` of peer `name`.
    pub async fn post_bytes(
        &self,
        name: &str,
        path: &str,
        query: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<(), PeerError> {
        let peer = self
            .peer(name)
            .ok_or_else(|| PeerError::Unknown(name.to_string()))?;
        let mut req = self
            .http
            .post(format!("{}{path}", peer.url.trim_end_matches('/')))
            .query(query)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        if let Some(t) = self.token() {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|source| PeerError::Transport {
            peer: name.to_string(),
            source,
        })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(PeerError::Refused {
                peer: name.to_string(),
                status: status.as_u16(),
                body: resp.text().await.unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// The peers in the order a job's intent goes to them: the job's
    /// rendezvous order of regions (the global tier's), without this one,
    /// so the first of them is the region a retry reaches when this one is
    /// gone.
    pub fn buddies_of(&self, job: Uuid) -> Vec<&str> {
        gangway_shared::ids::rendezvous(job, self.config.peers.iter().map(|p| p.name.as_str()))
    }
}

/// Whether a region that made round trips within `lease` to the peers with
/// these ages (seconds since the last one; `None`: never) holds a majority
/// of `regions` (itself included).
pub fn holds_majority(ok_ages: &[Option<f64>], lease: Duration, majority: usize) -> bool {
    majority_left(ok_ages, lease, majority).is_some()
}

/// How much longer the round trips with these ages keep a majority fresh
/// without another one; `None` when they do not now.
pub fn majority_left(
    ok_ages: &[Option<f64>],
    lease: Duration,
    majority: usize,
) -> Option<Duration> {
    let lease = lease.as_secs_f64();
    let mut fresh: Vec<f64> = ok_ages
        .iter()
        .flatten()
        .copied()
        .filter(|a| *a < lease)
        .collect();
    fresh.sort_by(f64::total_cmp);
    match majority.checked_sub(2) {
        // Alone (or a majority of one): nothing to lose.
        None => Some(Duration::MAX),
        Some(k) => fresh
            .get(k)
            .map(|age| Duration::from_secs_f64(lease - age.max(0.0))),
    }
}

/// The peers' loops, each a task of its own so that nothing slow delays a
/// heartbeat or a fence:
///
/// - the heartbeats: every beat, heartbeat every peer, record the answers,
///   unfence (after learning which jobs moved), and (the leader) adopt
///   dead regions' jobs;
/// - the [`watchdog`], which fences the region the moment the majority the
///   last beat saw runs out — also when no beat runs (its database is
///   down, or a beat is stuck), since the peers stop hearing a region
///   whose beats stall and adopt its jobs on that count;
/// - replication: the leader sends buddies what they have not been told,
///   checkpoint copies included (a large one takes a while).
pub async fn run_loop(state: AppState, shutdown: CancellationToken) {
    if state.peers.config.peers.is_empty() {
        return;
    }
    let every = state.peers.config.heartbeat_interval;
    let each = |f: fn(AppState) -> futures_util::future::BoxFuture<'static, ()>| {
        let (state, shutdown) = (state.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                f(state.clone()).await;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        })
    };
    let loops = [
        each(|s| Box::pin(async move { beat(&s).await })),
        each(|s| Box::pin(async move { watchdog(&s).await })),
        each(|s| {
            Box::pin(async move {
                if s.is_leader() && !s.peers.is_fenced() {
                    crate::replication::replicate_pending_intents(&s).await;
                    crate::replication::outbox::flush_all(&s).await;
                }
                if let Ok(lag) = s.store.replication_lag().await {
                    metrics::gauge!("gangway_replication_lag_seconds").set(lag);
                }
                if let Ok(lag) = s.store.usage_replication_lag().await {
                    metrics::gauge!("gangway_usage_replication_lag_seconds").set(lag);
                }
            })
        }),
    ];
    for l in loops {
        let _ = l.await;
    }
}

/// Fences the region once the majority the last beat saw has run out:
/// places nothing, refuses creates, and (the leader) asks every starting or
/// running job to checkpoint and stop, every beat while it lasts.
async fn watchdog(state: &AppState) {
    let peers = &state.peers;
    if !peers.majority_lost() {
        return;
    }
    if !peers.set_fenced(true) {
        tracing::warn!(
            lease_s = peers.config.lease.as_secs_f64(),
            "no round trip to a majority of regions within the lease (or none could be \
             recorded): fenced (placing nothing, asking running jobs to checkpoint and stop)"
        );
    }
    metrics::gauge!("gangway_region_fenced").set(1.0);
    if state.is_leader() {
        match state.store.fence_jobs().await {
            Ok(n) if n > 0 => tracing::warn!(jobs = n, "fenced: jobs asked to checkpoint and stop"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot stop jobs while fenced"),
        }
    }
}

async fn beat(state: &AppState) {
    let peers = &state.peers;
    let me = state.store.region().to_string();
    let view = match state.store.leases(&peers.names(), peers.uptime_s()).await {
        Ok(l) => l.silent_s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peers' leases");
            return;
        }
    };
    let hb = Heartbeat {
        from: me.clone(),
        silent_s: view,
    };
    let calls = peers.config.peers.iter().map(|p| {
        let hb = &hb;
        async move {
            let answer: Result<Heartbeat, _> = peers
                .post(&p.name, "/internal/v1/peers/heartbeat", hb)
                .await;
            (p.name.as_str(), answer)
        }
    });
    for (peer, answer) in futures_util::future::join_all(calls).await {
        match answer {
            Ok(theirs) if theirs.from == peer => {
                if let Err(e) = state.store.peer_answered(peer, &theirs.silent_s).await {
                    tracing::warn!(error = %e, peer, "cannot record a heartbeat's answer");
                }
            }
            Ok(theirs) => {
                tracing::warn!(peer, answered_as = %theirs.from, "a peer answered under another name")
            }
            Err(e) => tracing::debug!(error = %e, peer, "heartbeat failed"),
        }
    }
    // What the heartbeats just recorded decides fencing and adoption.
    let leases = match state.store.leases(&peers.names(), peers.uptime_s()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peers' leases");
            return;
        }
    };
    let left = majority_left(
        &leases.round_trip_s,
        peers.config.lease,
        peers.config.majority(),
    );
    *peers.majority_until.lock().expect("majority lock") =
        left.map(|l| Instant::now().checked_add(l).unwrap_or_else(far_future));
    if left.is_none() {
        watchdog(state).await;
        return;
    }
    metrics::gauge!("gangway_region_fenced").set(0.0);
    if peers.is_fenced() {
        // Before placing anything again: which of our jobs moved while we
        // were cut off.
        match crate::replication::learn_moves(state).await {
            Ok(moved) => {
                if moved > 0 {
                    tracing::warn!(
                        jobs = moved,
                        "jobs adopted elsewhere while fenced: released"
                    );
                }
                peers.set_fenced(false);
                tracing::info!("a majority of regions answers again: unfenced");
                state.wake_scheduler();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot learn which jobs moved: staying fenced");
                return;
            }
        }
    }
    if state.is_leader() {
        match crate::replication::adopt_dead(state, &leases).await {
            Ok(n) if n > 0 => {
                tracing::warn!(jobs = n, "adopted the jobs of a dead region");
                state.wake_scheduler();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "adoption check failed"),
        }
    }
}

/// An instant no lease reaches.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_counts_the_region_itself_and_fresh_round_trips_only() {
        let lease = Duration::from_secs(8);
        // Three regions: one fresh peer is enough.
        assert!(holds_majority(&[Some(1.0), None], lease, 2));
        assert!(!holds_majority(&[Some(9.0), None], lease, 2));
        assert!(!holds_majority(&[None, None], lease, 2));
        // Five regions: two fresh peers.
        assert!(!holds_majority(
            &[Some(1.0), None, None, Some(20.0)],
            lease,
            3
        ));
        assert!(holds_majority(
            &[Some(1.0), Some(2.0), None, None],
            lease,
            3
        ));
        let c = PeerConfig {
            peers: vec![
                Peer {
                    name: "a".into(),
                    url: String::new()
                };
                4
            ],
            ..PeerConfig::default()
        };
        assert_eq!(c.majority(), 3);
    }

    #[test]
    fn a_majority_lasts_until_its_freshest_needed_round_trip_is_a_lease_old() {
        let lease = Duration::from_secs(8);
        let left = |ages: &[Option<f64>], m| majority_left(ages, lease, m).map(|d| d.as_secs_f64());
        // Three regions: the freshest peer's round trip keeps it.
        assert_eq!(left(&[Some(3.0), Some(6.0)], 2), Some(5.0));
        assert_eq!(left(&[Some(9.0), None], 2), None);
        // Five regions: the second freshest.
        assert_eq!(left(&[Some(1.0), None, Some(7.0), Some(2.0)], 3), Some(6.0));
        assert_eq!(left(&[Some(1.0), None, None, Some(8.5)], 3), None);
        // Alone: never lost.
        assert_eq!(left(&[], 1), Some(Duration::MAX.as_secs_f64()));
    }

    #[test]
    fn a_jobs_buddies_are_every_peer_in_a_stable_order() {
        let peers = Peers::new(
            PeerConfig {
                peers: ["b", "c", "d"]
                    .iter()
                    .map(|n| Peer {
                        name: n.to_string(),
                        url: String::new(),
                    })
                    .collect(),
                ..PeerConfig::default()
            },
            Duration::from_secs(30),
        );
        let job = Uuid::from_u128(42);
        let order = peers.buddies_of(job);
        assert_eq!(order.len(), 3);
        assert_eq!(order, peers.buddies_of(job));
        // Different jobs spread over different buddies.
        let firsts: std::collections::BTreeSet<&str> = (0..64)
            .map(|i| peers.buddies_of(Uuid::from_u128(i))[0])
            .collect();
        assert_eq!(firsts.len(), 3);
    }
}
