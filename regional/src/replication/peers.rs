//! The link to the other regions (docs/failover.md): who they are, a
//! client to call them with this region's service token, and what the
//! last heartbeats left of a majority (fenced or not). The heartbeats
//! themselves, fencing and adoption run on the peers' beat
//! (`loops/beat.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gangway_auth::jwt::{claims_for, Role};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::{Peer, PeerConfig};
use crate::credentials::Credentials;

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
    /// No answer within the caller's patience (a peer whose packets
    /// vanish: a cut link answers nothing, not even a refusal).
    #[error("region {peer} did not answer within {after:?}")]
    Timeout {
        peer: String,
        after: std::time::Duration,
    },
}

/// The peers, a client to call them, and whether this region is fenced.
pub struct Peers {
    pub config: PeerConfig,
    /// [`PeerConfig::adopt_after`], resolved.
    pub adopt_after: Duration,
    /// The client to the peers and the key this region signs its tokens
    /// to them with, as last (re)loaded: each call uses the pair in use
    /// when it starts. (`config.signing_key` and `config.ca_pem` are what
    /// the region started with.)
    credentials: Credentials,
    fenced: AtomicBool,
    /// Until when the round trips the last beat found keep a majority
    /// fresh (`None`: they did not). Past it, the region fences, whether
    /// or not a beat runs to notice (the beat's watchdog, `loops/beat.rs`).
    majority_until: Mutex<Option<Instant>>,
    /// Replicas in this process made no round trip before this.
    pub started: Instant,
    /// What the last beat found of each peer, and the replication lag the
    /// last replication round measured, for the region's status.
    seen: Mutex<Seen>,
}

/// The peers as the region's status reports them.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Each peer: seconds since the last round trip to it (`None`: none
    /// yet), and when the beat read that.
    leases: Vec<(String, Option<f64>)>,
    read_at: Option<Instant>,
    replication_lag_s: Option<f64>,
}

const TOKEN_TTL: Duration = Duration::from_secs(600);

impl Peers {
    /// The peers of `config`, called with its signing key and CA.
    pub fn new(config: PeerConfig, adopt_after: Duration) -> Self {
        let credentials = Credentials::new(None, &config)
            .expect("the peers' CA was checked by RegionConfig::validate");
        Peers::with_credentials(config, adopt_after, credentials)
    }

    /// The peers of `config`, called with the client and key of
    /// `credentials` (the region's, which SIGHUP may replace).
    pub fn with_credentials(
        config: PeerConfig,
        adopt_after: Duration,
        credentials: Credentials,
    ) -> Self {
        // A region with peers starts fenced: it has not reached a majority
        // yet (the first beat tells).
        let fenced = !config.peers.is_empty();
        Peers {
            config,
            adopt_after,
            credentials,
            fenced: AtomicBool::new(fenced),
            majority_until: Mutex::new(None),
            started: Instant::now(),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Whether the majority the last beat saw has run out (or it saw none).
    pub(crate) fn majority_lost(&self) -> bool {
        let until = *self.majority_until.lock().expect("majority lock");
        until.is_none_or(|t| Instant::now() >= t)
    }

    /// Records how much longer the round trips the last beat found keep a
    /// majority fresh (`None`: they do not).
    pub(crate) fn set_majority_left(&self, left: Option<Duration>) {
        *self.majority_until.lock().expect("majority lock") =
            left.map(|l| Instant::now().checked_add(l).unwrap_or_else(far_future));
    }

    /// Records the round trips the last beat read (in the peers' order).
    pub(crate) fn saw_round_trips(&self, round_trip_s: &[Option<f64>]) {
        let mut seen = self.seen.lock().expect("seen lock");
        seen.leases = (self.config.peers.iter())
            .zip(round_trip_s)
            .map(|(p, s)| (p.name.clone(), *s))
            .collect();
        seen.read_at = Some(Instant::now());
    }

    /// Records the replication lag the last round measured.
    pub(crate) fn saw_replication_lag(&self, lag_s: f64) {
        self.seen.lock().expect("seen lock").replication_lag_s = Some(lag_s);
    }

    /// Each peer with the seconds since the last round trip to it, aged to
    /// now (`None`: none yet), and the replication lag last measured.
    pub fn lease_view(&self) -> (Vec<(String, Option<f64>)>, Option<f64>) {
        let seen = self.seen.lock().expect("seen lock");
        let aged = seen.read_at.map_or(0.0, |t| t.elapsed().as_secs_f64());
        (
            (seen.leases.iter())
                .map(|(n, s)| (n.clone(), s.map(|s| s + aged)))
                .collect(),
            seen.replication_lag_s,
        )
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

    /// The token to call peers with, from `material`'s key.
    fn token(material: &crate::credentials::Material) -> Option<String> {
        material.peer_token(
            || {
                claims_for(
                    Role::Service,
                    "gangway-region",
                    None,
                    None,
                    gangway_shared::tokens::ISSUER,
                    gangway_shared::tokens::REGION_AUDIENCE,
                    TOKEN_TTL,
                )
            },
            TOKEN_TTL / 2,
        )
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
        // This call's client and token: a reload meanwhile leaves them be.
        let material = self.credentials.current();
        let mut req = material
            .peer_http
            .post(format!("{}{path}", peer.url.trim_end_matches('/')))
            .json(body);
        if let Some(t) = Self::token(&material) {
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
        let material = self.credentials.current();
        let mut req = material
            .peer_http
            .post(format!("{}{path}", peer.url.trim_end_matches('/')))
            .query(query)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        if let Some(t) = Self::token(&material) {
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

/// An instant no lease reaches.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Peer;

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
