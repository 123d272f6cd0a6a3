//! What a running replica of the region shares between its HTTP handlers
//! and its loops: the database, the configuration, the link to the other
//! regions, the flags the loops set (leader, evacuating, metered hour), and
//! the caches that keep hot reads off the database (the fleet's shape, the
//! region's capacity). Everything here is cheap to clone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::config::RegionConfig;
use crate::credentials::Credentials;
use crate::replication::peers::Peers;
use crate::store::{FleetShape, Store, StoreError};

/// The fleet's shape by GPU type, with the fleet version it was read at.
type VersionedFleet = (i64, Arc<FleetByType>);

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<RegionConfig>,
    /// The verifier of callers' tokens, the key signing this region's
    /// tokens to its peers and the client to them, as in use now (take
    /// `credentials.current()` once per request): SIGHUP may replace them
    /// (`gangway region`); `config.auth` is the verifier it started with.
    pub credentials: Credentials,
    /// Wakes the scheduling loops early (new job, freed GPUs): every pass
    /// loop sees a wake-up sent since its last pass began.
    pub sched_wakeup: Arc<tokio::sync::watch::Sender<Wakeups>>,
    /// Whether this replica holds the scheduling leadership.
    pub leader: Arc<AtomicBool>,
    /// The other regions, and whether this one is fenced.
    pub peers: Arc<Peers>,
    /// New jobs' intents waiting to be handed to a buddy together (group
    /// commit, `replication::intents`).
    pub intents: Arc<crate::replication::intents::IntentBatcher>,
    /// Evacuated by its operators (`loops/evacuation.rs`): the region takes no
    /// new jobs and places nothing. Read from the database on every
    /// evacuation beat, so every replica follows within one.
    pub evacuating: Arc<AtomicBool>,
    /// The clock hour (since the epoch) up to which the leader metered live
    /// placements into the usage ledger (`loops/tick.rs`); 0: not yet.
    pub metered_hour: Arc<std::sync::atomic::AtomicI64>,
    /// The fleet's shape by GPU type, for validating submissions, with the
    /// fleet version it was read at.
    fleet: Arc<Mutex<Option<VersionedFleet>>>,
    /// Turns for sheddable requests (`api/shed.rs`).
    pub sheddable: Arc<tokio::sync::Semaphore>,
    /// The region's capacity and job counts as last read, and when
    /// (`GET /v1/region`, which every global replica polls every second:
    /// one read serves them all for [`STATUS_TTL`], and a stale one
    /// is answered while the next is read).
    pub(crate) status: Arc<StatusCache>,
}

type FleetByType = BTreeMap<String, Vec<FleetShape>>;

impl AppState {
    pub fn new(store: Store, config: RegionConfig) -> Self {
        let credentials = Credentials::new(config.auth.clone(), &config.peers)
            .expect("the peers' CA was checked by RegionConfig::validate");
        let peers = Peers::with_credentials(
            config.peers.clone(),
            config.adopt_after(),
            credentials.clone(),
        );
        let sheddable = sheddable_turns(store.pool_status().max_size);
        AppState {
            sheddable,
            status: Arc::default(),
            credentials,
            store,
            config: Arc::new(config),
            sched_wakeup: Arc::new(tokio::sync::watch::Sender::new(Wakeups::default())),
            leader: Arc::new(AtomicBool::new(false)),
            peers: Arc::new(peers),
            intents: Arc::default(),
            evacuating: Arc::new(AtomicBool::new(false)),
            metered_hour: Arc::new(std::sync::atomic::AtomicI64::new(0)),
            fleet: Arc::new(Mutex::new(None)),
        }
    }

    /// The fleet's shape, re-read only when its version moved (one
    /// single-row read per call otherwise).
    pub async fn fleet_shape(&self) -> Result<Arc<FleetByType>, StoreError> {
        let version = self.store.fleet_version().await?;
        self.fleet_shape_at(version).await
    }

    /// The fleet's shape at `version` (just read), re-read only when the
    /// cached one is older.
    pub async fn fleet_shape_at(&self, version: i64) -> Result<Arc<FleetByType>, StoreError> {
        if let Some((v, shape)) = self.fleet.lock().expect("fleet cache lock").as_ref() {
            if *v == version {
                return Ok(shape.clone());
            }
        }
        let (version, shape) = self.store.fleet_shape().await?;
        let shape = Arc::new(shape);
        *self.fleet.lock().expect("fleet cache lock") = Some((version, shape.clone()));
        Ok(shape)
    }

    /// What replication works with, as a view of this state.
    pub fn link(&self) -> crate::replication::Link<'_> {
        crate::replication::Link {
            store: &self.store,
            peers: &self.peers,
            intents: &self.intents,
            checkpoint_store: self.config.checkpoint_store.as_ref(),
        }
    }

    /// Wakes the scheduling loops: something changed that a pass may act
    /// on (GPUs freed, a node back, a job cancelled, a reservation…).
    pub fn wake_scheduler(&self) {
        self.sched_wakeup.send_modify(|w| {
            w.any = w.any.wrapping_add(1);
            w.other = w.other.wrapping_add(1);
        });
    }

    /// Wakes the scheduling loops for new jobs alone: a pool whose last
    /// pass could do nothing waits a little longer for them
    /// (`loops::scheduler`'s `FUTILE_PASS_GAP`).
    pub fn wake_scheduler_for_new_jobs(&self) {
        self.sched_wakeup
            .send_modify(|w| w.any = w.any.wrapping_add(1));
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// Whether the region is being evacuated (evacuating or evacuated).
    pub fn is_evacuating(&self) -> bool {
        self.evacuating.load(Ordering::Relaxed)
    }

    pub(crate) fn set_evacuating(&self, evacuating: bool) -> bool {
        self.evacuating.swap(evacuating, Ordering::Relaxed)
    }
}

/// The scheduling loops' wake-ups, counted: all of them, and those for
/// anything but new jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wakeups {
    pub any: u64,
    pub other: u64,
}

/// The share of the pool sheddable requests may hold at once: the rest is
/// kept for agents, operators and the region's own loops (`api/shed.rs`).
pub const SHEDDABLE_SHARE: f64 = 0.75;

/// Turns for sheddable requests, for a pool of `pool_size` connections.
pub fn sheddable_turns(pool_size: usize) -> Arc<Semaphore> {
    let n = ((pool_size as f64 * SHEDDABLE_SHARE).floor() as usize).max(1);
    Arc::new(Semaphore::new(n))
}

/// How long a read of the region's capacity answers `GET /v1/region`.
pub const STATUS_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Capacity per GPU type, queued jobs, running jobs, and the generation.
pub type Capacity = (Vec<gangway_shared::api::GpuTypeCapacity>, u64, u64, i64);

/// The last read of the region's capacity, and whether a read is under
/// way: `GET /v1/region` answers from it.
#[derive(Default)]
pub struct StatusCache {
    /// When the last read finished, how long it took, and what it read.
    last: std::sync::Mutex<Option<(std::time::Instant, std::time::Duration, Capacity)>>,
    /// One read at a time.
    reading: tokio::sync::Mutex<()>,
}

impl StatusCache {
    /// The last read, and whether it is fresh: younger than the TTL, or
    /// than four times what it took (a read that takes seconds on a large,
    /// busy region is not run back to back: at most a fifth of the
    /// database's time goes to it).
    pub fn fresh(&self) -> Option<(bool, Capacity)> {
        let last = self.last.lock().expect("status lock");
        last.as_ref()
            .map(|(at, took, c)| (at.elapsed() < STATUS_TTL.max(*took * 4), c.clone()))
    }

    /// Whether a read is under way.
    pub fn is_reading(&self) -> bool {
        self.reading.try_lock().is_err()
    }

    /// Reads the capacity again unless a read is under way (then waits for
    /// it) or one finished within the TTL.
    pub async fn refresh(&self, state: &AppState) -> Result<Capacity, StoreError> {
        let _reading = self.reading.lock().await;
        if let Some((true, c)) = self.fresh() {
            return Ok(c);
        }
        let started = std::time::Instant::now();
        let (caps, queued, running) = state.store.capacity(state.config.agent_timeout).await?;
        let c = (caps, queued, running, state.store.generation().await?);
        *self.last.lock().expect("status lock") =
            Some((std::time::Instant::now(), started.elapsed(), c.clone()));
        Ok(c)
    }
}
