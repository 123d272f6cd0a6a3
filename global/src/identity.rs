//! Tenants as records and API keys, kept by the regions: every record is
//! written to every region and read from a majority of them, so any global
//! replica finds the newest write of any other once a majority of regions
//! answers (each region keeps the highest version it was sent:
//! `regional/src/api/identity.rs`).
//!
//! Reads are cached for [`CACHE_TTL`] per replica: a suspended tenant or a
//! revoked key is refused by every replica within that time, whatever it
//! cached before (the replica that made the change at once). Keys fail
//! closed: no majority, no key. A tenant's state fails open for tokens (a
//! signed token vouches for its tenant; the last state seen is used while
//! the regions cannot say).
//!
//! API keys are `gwk_<16 hex>_<64 hex>`: the prefix lets secret scanners
//! find a leaked one, the first part is the key's id, the second its
//! secret (from two version-4 UUIDs: 244 random bits), of which the
//! regions keep only the SHA-256.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use chrono::Utc;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gangway_shared::api::{
    ApiKey, IdentityRecord, IdentityRecordList, IdentityWrite, TenantRecord, TenantState,
};
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::regions::{Call, Regions};

/// How long a replica trusts what it read of a tenant or a key.
pub const CACHE_TTL: Duration = Duration::from_secs(5);
/// How often a replica tells the regions a key was used.
const NOTE_USE_EVERY: Duration = Duration::from_secs(60);
/// How long a read waits for a majority of regions.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// How long readers of a record are told "no majority" after a read of it
/// found none, without asking again.
const FAILED_READ_BACKOFF: Duration = Duration::from_secs(1);
/// How long a write waits for a majority of regions to hold it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// An API key's prefix.
pub const KEY_PREFIX: &str = "gwk_";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Tenant,
    Key,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Tenant => "tenant",
            Kind::Key => "key",
        }
    }
}

/// A key as the regions keep it: what its holder sees, and the hash of
/// its secret.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredKey {
    #[serde(flatten)]
    pub key: ApiKey,
    pub secret_sha256: String,
}

type Cached = (Instant, Option<IdentityRecord>);

/// The turn to read one record: whoever holds it reads, the rest wait.
type ReadTurn = Arc<tokio::sync::Mutex<()>>;

#[derive(Default)]
pub struct Identity {
    cache: Mutex<HashMap<(Kind, String), Cached>>,
    /// One read of a record at a time per replica: when its cache entry
    /// runs out, the requests that find it so wait for the first one's
    /// read instead of each asking every region (under load, a herd of
    /// reads every few seconds that made regions shed).
    reading: Mutex<HashMap<(Kind, String), ReadTurn>>,
    /// When a read of a record last found no majority: for a second after,
    /// its readers are told so at once rather than asking again (with a
    /// partitioned region, each ask waits out its timeout).
    failed: Mutex<HashMap<(Kind, String), Instant>>,
    noted_use: Mutex<HashMap<String, Instant>>,
    last_version: AtomicI64,
}

fn unavailable(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::IDENTITY_UNAVAILABLE,
        format!(
            "too few regions answered to {what} (tenants and keys are kept by a majority of \
             regions); retry shortly"
        ),
    )
    .with_retry_after(2)
}

fn majority(regions: &Regions) -> usize {
    regions.list.len() / 2 + 1
}

/// Of two records of one id, the newer (a key's last use: the latest).
fn newer(a: Option<IdentityRecord>, b: IdentityRecord) -> IdentityRecord {
    match a {
        None => b,
        Some(a) => {
            let last_used_at = a.last_used_at.max(b.last_used_at);
            let mut n = if b.version > a.version { b } else { a };
            n.last_used_at = last_used_at;
            n
        }
    }
}

impl Identity {
    /// A version newer than `floor` and than any this replica gave before.
    fn next_version(&self, floor: i64) -> i64 {
        let now = Utc::now().timestamp_micros().max(floor + 1);
        let prev = self.last_version.fetch_max(now, Ordering::SeqCst);
        if prev >= now {
            self.last_version.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            now
        }
    }

    fn cached(&self, kind: Kind, id: &str, max_age: Option<Duration>) -> Option<Cached> {
        let cache = self.cache.lock().expect("identity cache lock");
        let hit = cache.get(&(kind, id.to_string()))?;
        max_age
            .is_none_or(|age| hit.0.elapsed() < age)
            .then(|| hit.clone())
    }

    fn remember(&self, kind: Kind, id: &str, record: Option<IdentityRecord>) {
        let mut cache = self.cache.lock().expect("identity cache lock");
        if cache.len() > 100_000 {
            cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
        }
        cache.insert((kind, id.to_string()), (Instant::now(), record));
    }

    /// The newest record of `kind`/`id` a majority of regions holds
    /// (cached for [`CACHE_TTL`]).
    pub async fn read(
        &self,
        regions: &Regions,
        kind: Kind,
        id: &str,
    ) -> Result<Option<IdentityRecord>, ApiError> {
        if let Some((_, r)) = self.cached(kind, id, Some(CACHE_TTL)) {
            return Ok(r);
        }
        let turn = {
            let mut reading = self.reading.lock().expect("identity reads lock");
            if reading.len() > 100_000 {
                reading.retain(|_, t| Arc::strong_count(t) > 1);
            }
            reading.entry((kind, id.to_string())).or_default().clone()
        };
        let _turn = turn.lock().await;
        // Read by the caller this one waited for.
        if let Some((_, r)) = self.cached(kind, id, Some(CACHE_TTL)) {
            return Ok(r);
        }
        let key = (kind, id.to_string());
        let failed_lately = |f: &HashMap<_, Instant>| {
            f.get(&key)
                .is_some_and(|at| at.elapsed() < FAILED_READ_BACKOFF)
        };
        if failed_lately(&self.failed.lock().expect("identity failures lock")) {
            return Err(unavailable("read it"));
        }
        match self.read_fresh(regions, kind, id).await {
            Ok(r) => {
                self.remember(kind, id, r.clone());
                Ok(r)
            }
            Err(e) => {
                let mut failed = self.failed.lock().expect("identity failures lock");
                failed.retain(|_, at| at.elapsed() < FAILED_READ_BACKOFF);
                failed.insert(key, Instant::now());
                Err(e)
            }
        }
    }

    /// [`Identity::read`] without the cache (what a change reads first).
    pub async fn read_fresh(
        &self,
        regions: &Regions,
        kind: Kind,
        id: &str,
    ) -> Result<Option<IdentityRecord>, ApiError> {
        // A region that does not answer (partitioned, not refusing) holds
        // up no caller for long.
        tokio::time::timeout(ASK_TIMEOUT, self.read_majority(regions, kind, id))
            .await
            .map_err(|_| unavailable("read it"))?
    }

    async fn read_majority(
        &self,
        regions: &Regions,
        kind: Kind,
        id: &str,
    ) -> Result<Option<IdentityRecord>, ApiError> {
        let path = format!("/internal/v1/identity/{}/{id}", kind.as_str());
        let mut asks: FuturesUnordered<_> = (regions.list.iter())
            .map(|r| regions.call(r, Method::GET, &path, Call::default()))
            .collect();
        let (mut answered, mut best) = (0, None);
        while let Some(a) = asks.next().await {
            match a {
                Ok(a) if a.status == StatusCode::OK => {
                    if let Ok(r) = serde_json::from_slice::<IdentityRecord>(&a.body) {
                        answered += 1;
                        best = Some(newer(best, r));
                    }
                }
                Ok(a) if a.status == StatusCode::NOT_FOUND => answered += 1,
                _ => {}
            }
            if answered >= majority(regions) {
                return Ok(best);
            }
        }
        Err(unavailable("read it"))
    }

    /// Writes `doc` as the newest version of `kind`/`id` (newer than
    /// `after`, the version it replaces) to every region; done once a
    /// majority holds it, the rest carry on in the background.
    #[allow(clippy::too_many_arguments)] // the record, and who asked why
    pub async fn write(
        &self,
        regions: &Arc<Regions>,
        kind: Kind,
        id: &str,
        after: i64,
        doc: serde_json::Value,
        action: &str,
        actor: &str,
    ) -> Result<IdentityRecord, ApiError> {
        let version = self.next_version(after);
        let body: bytes::Bytes = serde_json::to_vec(&IdentityWrite {
            version,
            doc: doc.clone(),
            action: action.to_string(),
        })
        .expect("a record serializes")
        .into();
        let path = format!("/internal/v1/identity/{}/{id}", kind.as_str());
        let (tx, mut rx) = tokio::sync::mpsc::channel(regions.list.len().max(1));
        for i in 0..regions.list.len() {
            let (regions, path, body, actor, tx) = (
                regions.clone(),
                path.clone(),
                body.clone(),
                actor.to_string(),
                tx.clone(),
            );
            tokio::spawn(async move {
                let r = &regions.list[i];
                let call = Call {
                    actor: Some(&actor),
                    body: Some(body),
                    ..Default::default()
                };
                let held = matches!(
                    regions.call(r, Method::PUT, &path, call).await,
                    Ok(a) if a.status == StatusCode::OK || a.status == StatusCode::ACCEPTED
                );
                let _ = tx.send(held).await;
            });
        }
        drop(tx);
        let held_by_majority = async {
            let mut held = 0;
            while let Some(ok) = rx.recv().await {
                held += ok as usize;
                if held >= majority(regions) {
                    return true;
                }
            }
            false
        };
        if tokio::time::timeout(WRITE_TIMEOUT, held_by_majority)
            .await
            .unwrap_or(false)
        {
            let record = IdentityRecord {
                version,
                doc,
                last_used_at: None,
            };
            self.remember(kind, id, Some(record.clone()));
            return Ok(record);
        }
        // Some regions may hold it: forget what this replica cached.
        self.cache
            .lock()
            .expect("identity cache lock")
            .remove(&(kind, id.to_string()));
        Err(unavailable("write it"))
    }

    /// Every record of `kind` (or of one tenant), the newest of each, as a
    /// majority of regions holds them.
    pub async fn list(
        &self,
        regions: &Regions,
        kind: Kind,
        tenant: Option<&str>,
    ) -> Result<BTreeMap<String, IdentityRecord>, ApiError> {
        tokio::time::timeout(ASK_TIMEOUT, self.list_majority(regions, kind, tenant))
            .await
            .map_err(|_| unavailable("list them"))?
    }

    async fn list_majority(
        &self,
        regions: &Regions,
        kind: Kind,
        tenant: Option<&str>,
    ) -> Result<BTreeMap<String, IdentityRecord>, ApiError> {
        let path = format!("/internal/v1/identity/{}", kind.as_str());
        let query =
            tenant.map(|t| gangway_shared::http::query_string(&[("tenant", t.to_string())]));
        let mut asks: FuturesUnordered<_> = (regions.list.iter())
            .map(|r| {
                let call = Call {
                    query: query.as_deref(),
                    ..Default::default()
                };
                regions.call(r, Method::GET, &path, call)
            })
            .collect();
        let mut answered = 0;
        let mut all: BTreeMap<String, IdentityRecord> = BTreeMap::new();
        while let Some(a) = asks.next().await {
            let Ok(a) = a else { continue };
            let Ok(list) = serde_json::from_slice::<IdentityRecordList>(&a.body) else {
                continue;
            };
            answered += 1;
            for (id, r) in list.records {
                let merged = newer(all.remove(&id), r);
                all.insert(id, merged);
            }
            // Any majority holds the newest of each (a write waits for
            // one): a region that does not answer holds up nothing.
            if answered >= majority(regions) {
                break;
            }
        }
        if answered < majority(regions) {
            return Err(unavailable("list them"));
        }
        Ok(all)
    }

    /// Tells the regions (in the background, at most once a minute per
    /// key and replica) that `key_id` was used now.
    pub fn note_use(&self, regions: &Arc<Regions>, key_id: &str) {
        {
            let mut noted = self.noted_use.lock().expect("noted use lock");
            if noted
                .get(key_id)
                .is_some_and(|at| at.elapsed() < NOTE_USE_EVERY)
            {
                return;
            }
            if noted.len() > 100_000 {
                noted.retain(|_, at| at.elapsed() < NOTE_USE_EVERY);
            }
            noted.insert(key_id.to_string(), Instant::now());
        }
        let regions = regions.clone();
        let path = format!("/internal/v1/identity/key/{key_id}/used");
        let body: bytes::Bytes = serde_json::to_vec(&serde_json::json!({"at": Utc::now()}))
            .expect("json")
            .into();
        tokio::spawn(async move {
            let calls = regions.list.iter().map(|r| {
                let call = Call {
                    body: Some(body.clone()),
                    ..Default::default()
                };
                regions.call(r, Method::POST, &path, call)
            });
            futures_util::future::join_all(calls).await;
        });
    }

    /// The tenant's record, if it has one. A tenant's state fails open: if
    /// no majority answers, the last record this replica saw (or none).
    pub async fn tenant(&self, regions: &Regions, tenant: &str) -> Option<TenantRecord> {
        let record = match self.read(regions, Kind::Tenant, tenant).await {
            Ok(r) => r,
            Err(_) => {
                let stale = self.cached(Kind::Tenant, tenant, None).and_then(|(_, r)| r);
                // Not asked again for a while: a tenant's every request
                // would wait on the regions that do not answer.
                self.remember(Kind::Tenant, tenant, stale.clone());
                stale
            }
        };
        record.and_then(|r| serde_json::from_value(r.doc).ok())
    }
}

/// 403 `tenant_suspended` if an operator suspended `tenant`.
pub async fn check_tenant(
    identity: &Identity,
    regions: &Regions,
    tenant: &str,
) -> Result<(), ApiError> {
    match identity.tenant(regions, tenant).await {
        Some(t) if t.state == TenantState::Suspended => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            codes::TENANT_SUSPENDED,
            format!(
                "tenant {tenant:?} is suspended by an operator: its tokens and keys are refused \
                 until it is resumed"
            ),
        )),
        _ => Ok(()),
    }
}

/// A new key's id and secret: `(id, "gwk_<id>_<secret>", sha256 of it)`.
pub fn new_key() -> (String, String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let token = format!("{KEY_PREFIX}{id}_{secret}");
    let hash = sha256_hex(&token);
    (id, token, hash)
}

pub fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn hex_of_len(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `id` is shaped as a key's id (16 hex digits).
pub fn valid_key_id(id: &str) -> bool {
    hex_of_len(id, 16)
}

/// The key id of a token shaped as an API key.
pub fn key_id_of(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (valid_key_id(id) && hex_of_len(secret, 64)).then_some(id)
}

/// Equal without telling how much of it was equal by how long it took.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Why an API key was refused.
pub enum KeyRefusal {
    /// No majority of regions answered.
    Unavailable(ApiError),
    /// Unknown, wrong secret, revoked or expired: the message says which
    /// (not which of unknown and wrong secret).
    Invalid(&'static str),
}

/// The key `token` is, checked: its secret, not revoked, not expired.
pub async fn verify_key(
    identity: &Identity,
    regions: &Arc<Regions>,
    token: &str,
) -> Result<ApiKey, KeyRefusal> {
    let Some(id) = key_id_of(token) else {
        return Err(KeyRefusal::Invalid(
            "not an API key (gwk_<16 hex>_<64 hex>)",
        ));
    };
    let record = identity
        .read(regions, Kind::Key, id)
        .await
        .map_err(KeyRefusal::Unavailable)?;
    let stored: Option<StoredKey> = record.and_then(|r| serde_json::from_value(r.doc).ok());
    let Some(stored) = stored.filter(|s| same(&s.secret_sha256, &sha256_hex(token))) else {
        return Err(KeyRefusal::Invalid("unknown API key"));
    };
    if stored.key.revoked_at.is_some() {
        return Err(KeyRefusal::Invalid("this API key was revoked"));
    }
    if stored.key.expires_at.is_some_and(|t| t <= Utc::now()) {
        return Err(KeyRefusal::Invalid("this API key has expired"));
    }
    identity.note_use(regions, id);
    Ok(stored.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_recognisable_and_checked_by_shape() {
        let (id, token, hash) = new_key();
        assert_eq!(key_id_of(&token), Some(id.as_str()));
        assert!(token.starts_with("gwk_") && token.len() == 4 + 16 + 1 + 64);
        assert_eq!(hash, sha256_hex(&token));
        let (_, other, _) = new_key();
        assert_ne!(token, other);
        for bad in [
            "gwk_",
            "gwk_0123456789abcdef",
            "gwk_0123456789abcdef_00",
            "gwk_0123456789abcdeg_0000000000000000000000000000000000000000000000000000000000000000",
            "xyz_0123456789abcdef_0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert_eq!(key_id_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_newer_record_wins_and_keeps_the_latest_use() {
        let at = |s| chrono::DateTime::from_timestamp(s, 0);
        let a = IdentityRecord {
            version: 2,
            doc: serde_json::json!({"v": 2}),
            last_used_at: at(10),
        };
        let b = IdentityRecord {
            version: 1,
            doc: serde_json::json!({"v": 1}),
            last_used_at: at(20),
        };
        let n = newer(Some(a.clone()), b.clone());
        assert_eq!((n.version, n.last_used_at), (2, at(20)));
        let n = newer(Some(b), a);
        assert_eq!((n.version, n.last_used_at), (2, at(20)));
    }

    #[test]
    fn versions_only_grow() {
        let id = Identity::default();
        let far = Utc::now().timestamp_micros() + 10_000_000;
        let v1 = id.next_version(far);
        let v2 = id.next_version(0);
        assert!(v1 > far && v2 > v1);
    }
}
