//! The regions behind the global tier: forwarding calls with a short-lived
//! service token, and a view of each region's health and capacity kept
//! fresh by a background poller.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{Method, StatusCode};
use futures_util::future::join_all;
use gangway_auth::jwt::{claims_for, Role};
use gangway_shared::api::{RegionInfo, RegionStatus};
use gangway_shared::client::{CLAIM_HEADER, CLAIM_HERE, IDEMPOTENCY_KEY_HEADER, TENANT_HEADER};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{GlobalConfig, RegionEndpoint, SERVICE_AUDIENCE, SERVICE_ISSUER};
use crate::credentials::Credentials;

/// Counts a call to `region` that failed: `unreachable` (no answer),
/// `timeout` (no answer in time) or `server_error` (a 5xx answer).
fn call_failed(region: &Region, kind: &'static str) {
    metrics::counter!(
        "gangway_global_region_call_errors_total",
        "region" => region.name.clone(),
        "kind" => kind
    )
    .increment(1);
}

/// An error and every error under it, `outer: inner: …`.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// Set by a region on the answer to a retried create.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// How long a service token lives; it is renewed at half-life.
const SERVICE_TOKEN_TTL: Duration = Duration::from_secs(300);

#[derive(Debug, Default, Clone)]
struct View {
    last_ok: Option<Instant>,
    last_error: Option<String>,
    status: Option<RegionStatus>,
    /// GPUs of each type this replica has sent the region new jobs for
    /// since `status` was read: not in its backlog yet, but they will be.
    routed: std::collections::BTreeMap<String, u32>,
    /// Its last status poll found it overloaded or slow, not failed.
    busy: bool,
}

pub struct Region {
    pub name: String,
    url: String,
    view: Mutex<View>,
}

/// A region's answer: status and raw JSON body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
    /// The region answered a retried create with the original job.
    pub replayed: bool,
    /// The region's `Retry-After` (an overloaded region's 503), passed on.
    pub retry_after: Option<reqwest::header::HeaderValue>,
    /// The region's word on a create's claim (`X-Gangway-Claim`: `held`
    /// or `elsewhere`), if it gave one.
    pub claim: Option<reqwest::header::HeaderValue>,
}

/// The region could not be reached, or did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("region {region} unavailable: {reason}")]
pub struct Unreachable {
    pub region: String,
    pub reason: String,
    /// The region took the connection but did not answer in time: slow,
    /// not shown dead (its health window decides).
    pub slow: bool,
}

pub struct Regions {
    pub list: Vec<Region>,
    /// The client to the regions and the service key, as last (re)loaded.
    credentials: Credentials,
    unhealthy_after: Duration,
    health_interval: Duration,
}

/// What a forwarded call carries besides method and path.
#[derive(Default)]
pub struct Call<'a> {
    pub tenant: Option<&'a str>,
    /// The operator (admin token subject) of an admin call, for the
    /// region's audit log (`X-Gangway-Actor`).
    pub actor: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    pub query: Option<&'a str>,
    pub body: Option<Bytes>,
    /// A keyed create whose key's claim the region records itself
    /// (`X-Gangway-Claim: here`, [`gangway_shared::client::CLAIM_HEADER`]).
    pub claim_here: bool,
}

/// On whose behalf a forwarded call is made: a tenant (about its own
/// things) or an operator (about anyone's; named in the region's audit log).
#[derive(Clone, Copy, Debug)]
pub enum Who<'a> {
    Tenant(&'a str),
    Operator(&'a str),
}

impl<'a> Who<'a> {
    /// A call naming the tenant or the operator, and nothing else yet.
    pub fn call(self) -> Call<'a> {
        match self {
            Who::Tenant(t) => Call {
                tenant: Some(t),
                ..Default::default()
            },
            Who::Operator(a) => Call {
                actor: Some(a),
                ..Default::default()
            },
        }
    }
}

impl Regions {
    /// The regions of `config`, called with the credentials it names.
    pub fn new(config: &GlobalConfig) -> anyhow::Result<Self> {
        Regions::with_credentials(config, Credentials::new(config)?)
    }

    /// The regions of `config`, called with `credentials` (which a reload
    /// may replace: each call uses the client and key in use when it
    /// starts).
    pub fn with_credentials(
        config: &GlobalConfig,
        credentials: Credentials,
    ) -> anyhow::Result<Self> {
        // With the cloud's CA, every region is called over HTTPS.
        if config.region_ca_pem.is_some() {
            for r in &config.regions {
                let what = format!("--region {}", r.name);
                gangway_shared::client::check_internal_url(&r.url, true, false, &what)
                    .map_err(|e| anyhow::anyhow!(e))?;
            }
        }
        Ok(Regions {
            list: config
                .regions
                .iter()
                .map(|RegionEndpoint { name, url }| Region {
                    name: name.clone(),
                    url: url.trim_end_matches('/').to_string(),
                    view: Mutex::new(View::default()),
                })
                .collect(),
            credentials,
            unhealthy_after: config.unhealthy_after,
            health_interval: config.health_interval,
        })
    }

    pub fn get(&self, name: &str) -> Option<&Region> {
        self.list.iter().find(|r| r.name == name)
    }

    /// The token regions accept from the global tier, minted on demand
    /// with the service key of `material`.
    fn service_token(material: &crate::credentials::Material) -> String {
        material.service_token(
            || {
                claims_for(
                    Role::Service,
                    "gangway-global",
                    None,
                    None,
                    SERVICE_ISSUER,
                    SERVICE_AUDIENCE,
                    SERVICE_TOKEN_TTL,
                )
            },
            SERVICE_TOKEN_TTL / 2,
        )
    }

    /// A token for agent `agent_id` of `region`, valid for `ttl`: the
    /// regions trust this tier's service key, and check the token's
    /// subject against the agent of every call.
    pub fn agent_token(&self, region: &str, agent_id: &str, ttl: Duration) -> String {
        let claims = claims_for(
            Role::Agent,
            agent_id,
            None,
            Some(region),
            SERVICE_ISSUER,
            SERVICE_AUDIENCE,
            ttl,
        );
        (self.credentials.current().service_key)
            .sign(&claims)
            .expect("signing with a loaded key does not fail")
    }

    /// Sends one call to `region` and returns its answer, whatever the
    /// status. Only transport failures are errors.
    pub async fn call(
        &self,
        region: &Region,
        method: Method,
        path: &str,
        call: Call<'_>,
    ) -> Result<Answer, Unreachable> {
        let mut url = format!("{}{}", region.url, path);
        if let Some(q) = call.query.filter(|q| !q.is_empty()) {
            url.push('?');
            url.push_str(q);
        }
        // This call's client and token: a reload meanwhile leaves them be.
        let material = self.credentials.current();
        let mut req = material
            .http
            .request(method, &url)
            .bearer_auth(Self::service_token(&material));
        if let Some(t) = call.tenant {
            req = req.header(TENANT_HEADER, t);
        }
        if let Some(a) = call.actor {
            req = req.header(gangway_shared::api::ACTOR_HEADER, a);
        }
        if let Some(k) = call.idempotency_key {
            req = req.header(IDEMPOTENCY_KEY_HEADER, k);
        }
        if call.claim_here {
            req = req.header(CLAIM_HEADER, CLAIM_HERE);
        }
        // The caller's request id goes on, so the region's log lines of
        // this call carry the id the caller was given.
        if let Some(id) = gangway_shared::http::current_request_id() {
            req = req.header(gangway_shared::http::REQUEST_ID_HEADER, id);
        }
        // And the trace it is part of, where traces are exported.
        req = req.headers(gangway_shared::otel::context_headers());
        if let Some(body) = call.body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let started = std::time::Instant::now();
        let unreachable = |e: reqwest::Error| {
            let slow = e.is_timeout() && !e.is_connect();
            call_failed(region, if slow { "timeout" } else { "unreachable" });
            Unreachable {
                region: region.name.clone(),
                // With its causes: "… invalid peer certificate: UnknownIssuer"
                // tells an operator the CA is wrong, not the network.
                reason: with_causes(&e),
                slow,
            }
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status =
            StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let replayed = resp.headers().contains_key(REPLAYED_HEADER);
        let retry_after = resp.headers().get(reqwest::header::RETRY_AFTER).cloned();
        let claim = resp.headers().get(CLAIM_HEADER).cloned();
        let body = resp.bytes().await.map_err(unreachable)?;
        metrics::histogram!("gangway_global_region_call_seconds", "region" => region.name.clone())
            .record(started.elapsed().as_secs_f64());
        if status.is_server_error() {
            call_failed(region, "server_error");
        }
        if status == StatusCode::SERVICE_UNAVAILABLE
            && retry_after.is_some()
            && !database_down(&body)
        {
            // An overloaded region shedding load (`overloaded`) is alive:
            // its answer (503, Retry-After) goes to the caller, and it
            // stays as healthy as it was.
        } else if status.is_server_error() {
            // A region that answers 5xx is not fit to take work now.
            region.mark_failed(format!("answered {status}"));
        } else {
            region.mark_ok(None);
        }
        Ok(Answer {
            status,
            body,
            replayed,
            retry_after,
            claim,
        })
    }

    /// Regions that answered recently, in configuration order.
    pub fn healthy(&self) -> Vec<&Region> {
        self.list
            .iter()
            .filter(|r| r.is_healthy(self.unhealthy_after))
            .collect()
    }

    pub fn infos(&self) -> Vec<RegionInfo> {
        self.list
            .iter()
            .map(|r| {
                let v = r.view.lock().expect("view lock").clone();
                RegionInfo {
                    name: r.name.clone(),
                    healthy: r.is_healthy(self.unhealthy_after),
                    last_seen_ms: v.last_ok.map(|t| t.elapsed().as_millis() as u64),
                    last_error: v.last_error,
                    status: v.status,
                }
            })
            .collect()
    }

    /// Refreshes every region's view once, concurrently.
    pub async fn refresh_all(&self) {
        let polls = self.list.iter().map(|r| self.refresh(r));
        join_all(polls).await;
    }

    async fn refresh(&self, region: &Region) {
        match self
            .call(region, Method::GET, "/v1/region", Call::default())
            .await
        {
            Ok(a) if a.status.is_success() => {
                match serde_json::from_slice::<RegionStatus>(&a.body) {
                    // A fenced region takes no new work: route around it.
                    Ok(status) if status.fenced => {
                        region.mark_failed("fenced: cut off from a majority of regions".into())
                    }
                    Ok(status) => region.mark_ok(Some(status)),
                    Err(e) => region.mark_failed(format!("bad status document: {e}")),
                }
            }
            // Overloaded (503 with Retry-After) or slow to answer: busy,
            // not dead. It stays as healthy as it was; if it stays that
            // way, it ages out after `unhealthy_after` without an answer.
            Ok(a) if a.retry_after.is_some() && !database_down(&a.body) => region.mark_busy(),
            Err(e) if e.slow => {
                tracing::debug!(region = %region.name, reason = %e.reason, "status poll timed out");
                region.mark_busy();
            }
            Ok(a) => region.mark_failed(format!("status answered {}", a.status)),
            Err(e) => region.mark_failed(e.reason),
        }
    }
}

/// Whether a region's answer says its database is unavailable (failing
/// over to a standby, or gone): retryable, so it carries `Retry-After` like
/// an overloaded region's, but the region takes no work until it is back,
/// so unpinned jobs go around it meanwhile rather than waiting for it.
fn database_down(body: &[u8]) -> bool {
    serde_json::from_slice::<gangway_shared::error::ErrorBody>(body)
        .is_ok_and(|e| e.code == gangway_shared::error::codes::UNAVAILABLE)
}

impl Region {
    fn mark_ok(&self, status: Option<RegionStatus>) {
        let mut v = self.view.lock().expect("view lock");
        v.last_ok = Some(Instant::now());
        v.last_error = None;
        v.busy = false;
        if status.is_some() {
            v.status = status;
            v.routed.clear();
        }
    }

    fn mark_busy(&self) {
        self.view.lock().expect("view lock").busy = true;
    }

    /// Overloaded or slow at its last status poll (not failed): a client
    /// should retry rather than be told no region is available.
    pub fn is_busy(&self) -> bool {
        self.view.lock().expect("view lock").busy
    }

    fn mark_failed(&self, why: String) {
        let mut v = self.view.lock().expect("view lock");
        v.last_error = Some(why);
        v.busy = false;
        // A failed call ages the region out at once rather than after the
        // health window: new work avoids it until it answers again.
        v.last_ok = None;
    }

    pub fn is_healthy(&self, window: Duration) -> bool {
        let v = self.view.lock().expect("view lock");
        v.last_ok.is_some_and(|t| t.elapsed() < window)
    }

    /// Being evacuated by its operators, as last seen: it takes no new
    /// jobs (creates go to other regions).
    pub fn is_evacuating(&self) -> bool {
        let v = self.view.lock().expect("view lock");
        v.status.as_ref().is_some_and(|s| s.evacuating)
    }

    /// Its capacity of `gpu_type` as last seen, with what this replica
    /// has sent it since in its backlog.
    pub fn capacity(&self, gpu_type: &str) -> Option<crate::routing::Capacity> {
        let v = self.view.lock().expect("view lock");
        let routed = v.routed.get(gpu_type).copied().unwrap_or(0);
        v.status.as_ref().and_then(|s| {
            s.capacity
                .iter()
                .find(|c| c.gpu_type == gpu_type)
                .map(|c| crate::routing::Capacity {
                    free: c.free,
                    schedulable: c.schedulable,
                    backlog: c.queued.saturating_add(routed),
                })
        })
    }

    /// A new job of `gpus` GPUs of `gpu_type` was sent to it (counted in
    /// its backlog until its next status, which has it).
    pub fn note_routed(&self, gpu_type: &str, gpus: u32) {
        let mut v = self.view.lock().expect("view lock");
        *v.routed.entry(gpu_type.to_string()).or_default() += gpus;
    }
}

/// Polls every region's `/v1/region` until `shutdown`.
pub async fn poll_health(regions: Arc<Regions>, shutdown: CancellationToken) {
    let span = tracing::info_span!("region_health");
    // Each region on a cadence of its own: a region whose poll hangs (its
    // link cut, so nothing answers, not even a refusal, until the request
    // times out) must not hold up the others' polls until their health
    // ages out too.
    let polls = (0..regions.list.len()).map(|i| {
        let (regions, shutdown) = (regions.clone(), shutdown.clone());
        async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(regions.health_interval) => {}
                }
                regions.refresh(&regions.list[i]).await;
            }
        }
    });
    join_all(polls).instrument(span).await;
}
