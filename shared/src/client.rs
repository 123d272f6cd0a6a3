//! A typed HTTP client for the job API.
//!
//! Until the global tier exists, it talks to a region directly and names the
//! tenant in the `X-Gangway-Tenant` header.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use crate::api::{
    Cluster, ClusterList, ClusterResize, ClusterSpec, DryRun, Explanation, Job, JobEvents, JobList,
    JobSpec, JobState, LimitsUpdate, Quota, QuotaList, QuotaUpdate, RegionList, RegionStatus,
    Reservation, ReservationList, ReservationResize, ReservationSpec, TenantLimits,
    TenantLimitsList,
};
use crate::error::ErrorBody;

/// The header that names the tenant on the regional API.
pub const TENANT_HEADER: &str = "x-gangway-tenant";
/// The header that carries the idempotency key of a create.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Between the global tier and a region, on a keyed create: the global
/// tier sends [`CLAIM_HERE`] when the region it sends the job to is also
/// the first of the key's claim order, and the region records the key's
/// claim in the create's own commit (instead of a claim call first). The
/// region answers [`CLAIM_HELD`] when the claim is its own, or 409 with
/// [`CLAIM_ELSEWHERE`] when another region's claim holds the key (nothing
/// made; the global tier claims as usual and goes there).
pub const CLAIM_HEADER: &str = "x-gangway-claim";
pub const CLAIM_HERE: &str = "here";
pub const CLAIM_HELD: &str = "held";
pub const CLAIM_ELSEWHERE: &str = "elsewhere";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error body.
    #[error("{status}: {} ({})", body.message, body.code)]
    Api {
        status: StatusCode,
        body: ErrorBody,
        /// The answer's `Retry-After` in seconds (a retryable 503 or 429).
        retry_after: Option<u64>,
    },
    /// The request may or may not have reached the server.
    #[error("cannot reach {url}: {source}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered something that is not our JSON.
    #[error("unexpected answer from {url} ({status}): {text}")]
    Unexpected {
        url: String,
        status: StatusCode,
        text: String,
    },
}

impl ClientError {
    /// The stable error code, when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { body, .. } => Some(&body.code),
            _ => None,
        }
    }

    /// The answer's `Retry-After` in seconds, when it sent one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ClientError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } | ClientError::Unexpected { status, .. } => {
                Some(*status)
            }
            ClientError::Transport { .. } => None,
        }
    }
}

/// Filters for listing jobs.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    pub state: Option<JobState>,
    pub name: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    tenant: Option<String>,
    token: Option<String>,
}

impl Client {
    /// A client for a region at `base` (for example `http://127.0.0.1:7001`)
    /// acting as `tenant` through the `X-Gangway-Tenant` header (the global
    /// tier's way of calling regions; regions also want a service token,
    /// see [`Client::with_token`]).
    pub fn new(base: impl Into<String>, tenant: impl Into<String>) -> Self {
        Client::build(base.into(), None)
            .expect("a client without a custom CA always builds")
            .with_tenant(tenant)
    }

    /// A client for a region at `base` acting as `tenant`, like
    /// [`Client::new`], trusting `ca_pem` too (a region served over TLS
    /// with the cloud's own CA).
    pub fn region(
        base: impl Into<String>,
        tenant: impl Into<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, String> {
        Ok(Client::build(base.into(), ca_pem)?.with_tenant(tenant))
    }

    /// A client for the public API at `base` (https), authenticating with
    /// `token`, trusting `ca_pem` alone when given (as `curl --cacert`), else
    /// the system's roots.
    pub fn public(
        base: impl Into<String>,
        token: impl Into<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, String> {
        Ok(Client::build(base.into(), ca_pem)?.with_token(token))
    }

    /// [`Client::public`] for a command that makes a request or a few, one
    /// at a time, and exits (the CLI): it speaks HTTP/1.1, so its one
    /// connection costs neither end HTTP/2's preface, settings and header
    /// tables (issue 23: a `gangway job submit` at 8 shells is CPU-bound,
    /// client and global tier together). Requests made at once open a
    /// connection each.
    pub fn one_shot(
        base: impl Into<String>,
        token: impl Into<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, String> {
        let builder = reqwest::Client::builder().http1_only();
        Ok(Client::build_with(builder, base.into(), ca_pem)?.with_token(token))
    }

    fn build(base: String, ca_pem: Option<&[u8]>) -> Result<Self, String> {
        Client::build_with(reqwest::Client::builder(), base, ca_pem)
    }

    fn build_with(
        builder: reqwest::ClientBuilder,
        base: String,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, String> {
        let mut builder = builder.timeout(Duration::from_secs(30));
        if let Some(pem) = ca_pem {
            let cert = reqwest::Certificate::from_pem(pem)
                .map_err(|e| format!("the CA certificate is not valid PEM: {e}"))?;
            // The given CA alone: reading and parsing the system's roots
            // (hundreds of files) was most of a CLI call's CPU (issue 23).
            builder = builder
                .tls_built_in_root_certs(false)
                .add_root_certificate(cert);
        }
        let http = builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            tenant: None,
            token: None,
        })
    }

    /// Names the tenant in the `X-Gangway-Tenant` header.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Sends `Authorization: Bearer <token>`.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Submits a job. The same `idempotency_key` and spec always yield the
    /// same job.
    pub async fn submit(
        &self,
        spec: &JobSpec,
        idempotency_key: Option<&str>,
    ) -> Result<Job, ClientError> {
        let mut req = self.request(Method::POST, "/v1/jobs").json(spec);
        if let Some(key) = idempotency_key {
            req = req.header(IDEMPOTENCY_KEY_HEADER, key);
        }
        self.send(req).await
    }

    /// What a submit would do now, without creating anything.
    pub async fn dry_run(&self, spec: &JobSpec) -> Result<DryRun, ClientError> {
        self.send(self.request(Method::POST, "/v1/jobs/dry-run").json(spec))
            .await
    }

    pub async fn get(&self, id: Uuid) -> Result<Job, ClientError> {
        self.send(self.request(Method::GET, &format!("/v1/jobs/{id}")))
            .await
    }

    pub async fn list(&self, query: &ListQuery) -> Result<JobList, ClientError> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(state) = query.state {
            params.push(("state", state.as_str().to_string()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        if let Some(name) = &query.name {
            params.push(("name", name.clone()));
        }
        if let Some(cursor) = &query.cursor {
            params.push(("cursor", cursor.clone()));
        }
        self.send(self.request(Method::GET, "/v1/jobs").query(&params))
            .await
    }

    pub async fn cancel(&self, id: Uuid) -> Result<Job, ClientError> {
        self.send(self.request(Method::POST, &format!("/v1/jobs/{id}/cancel")))
            .await
    }

    pub async fn events(&self, id: Uuid) -> Result<JobEvents, ClientError> {
        self.send(self.request(Method::GET, &format!("/v1/jobs/{id}/events")))
            .await
    }

    /// A job's output after `after` (the `next_after` of a read; empty:
    /// from the start), of one rank or attempt if given.
    pub async fn logs(
        &self,
        id: Uuid,
        rank: Option<u32>,
        attempt: Option<i32>,
        after: &str,
    ) -> Result<crate::api::JobLogs, ClientError> {
        let mut q = vec![("after", after.to_string())];
        if let Some(r) = rank {
            q.push(("rank", r.to_string()));
        }
        if let Some(a) = attempt {
            q.push(("attempt", a.to_string()));
        }
        let path = format!("/v1/jobs/{id}/logs?{}", crate::http::query_string(&q));
        self.send(self.request(Method::GET, &path)).await
    }

    pub async fn explain(&self, id: Uuid) -> Result<Explanation, ClientError> {
        self.send(self.request(Method::GET, &format!("/v1/jobs/{id}/explain")))
            .await
    }

    /// Reserves capacity. The same `idempotency_key` and spec always
    /// yield the same reservation. A refusal is [`ClientError::Api`] with
    /// `reservation_unavailable` and, when one exists, the earliest window
    /// that would work in the body's `earliest_start` / `earliest_end`.
    pub async fn create_reservation(
        &self,
        spec: &ReservationSpec,
        idempotency_key: Option<&str>,
    ) -> Result<Reservation, ClientError> {
        self.keyed(Method::POST, RESERVATIONS, Some(spec), idempotency_key)
            .await
    }

    pub async fn get_reservation(&self, id: Uuid) -> Result<Reservation, ClientError> {
        self.keyed(Method::GET, &one(RESERVATIONS, id), NO_BODY, None)
            .await
    }

    /// The tenant's reservations, newest first.
    pub async fn list_reservations(&self) -> Result<ReservationList, ClientError> {
        self.keyed(Method::GET, RESERVATIONS, NO_BODY, None).await
    }

    /// Changes a reservation's size and/or end.
    pub async fn resize_reservation(
        &self,
        id: Uuid,
        resize: &ReservationResize,
        idempotency_key: Option<&str>,
    ) -> Result<Reservation, ClientError> {
        let path = one(RESERVATIONS, id);
        self.keyed(Method::PATCH, &path, Some(resize), idempotency_key)
            .await
    }

    /// Deletes a reservation (again: the same answer).
    pub async fn delete_reservation(
        &self,
        id: Uuid,
        idempotency_key: Option<&str>,
    ) -> Result<Reservation, ClientError> {
        let path = one(RESERVATIONS, id);
        self.keyed(Method::DELETE, &path, NO_BODY, idempotency_key)
            .await
    }

    /// An operator's reservation for `tenant` (operator token), as the
    /// tenant's own create; its region audits it.
    pub async fn create_reservation_for(
        &self,
        tenant: &str,
        spec: &ReservationSpec,
        idempotency_key: Option<&str>,
    ) -> Result<Reservation, ClientError> {
        let path = format!("/v1/admin/tenants/{tenant}/reservations");
        self.keyed(Method::POST, &path, Some(spec), idempotency_key)
            .await
    }

    /// An operator's resize of any tenant's reservation (audited).
    pub async fn resize_any_reservation(
        &self,
        id: Uuid,
        resize: &ReservationResize,
        idempotency_key: Option<&str>,
    ) -> Result<Reservation, ClientError> {
        let path = one(ADMIN_RESERVATIONS, id);
        self.keyed(Method::PATCH, &path, Some(resize), idempotency_key)
            .await
    }

    /// An operator's delete of any tenant's reservation (audited).
    pub async fn delete_any_reservation(
        &self,
        id: Uuid,
        idempotency_key: Option<&str>,
    ) -> Result<Reservation, ClientError> {
        let path = one(ADMIN_RESERVATIONS, id);
        self.keyed(Method::DELETE, &path, NO_BODY, idempotency_key)
            .await
    }

    /// Creates a dedicated cluster: whole nodes bound all at once, or a
    /// refusal ([`ClientError::Api`] with `cluster_unavailable`) with
    /// nothing bound. The same `idempotency_key` and spec always yield the
    /// same cluster.
    pub async fn create_cluster(
        &self,
        spec: &ClusterSpec,
        idempotency_key: Option<&str>,
    ) -> Result<Cluster, ClientError> {
        self.keyed(Method::POST, CLUSTERS, Some(spec), idempotency_key)
            .await
    }

    /// A cluster, with its newest events.
    pub async fn get_cluster(&self, id: Uuid) -> Result<Cluster, ClientError> {
        self.keyed(Method::GET, &one(CLUSTERS, id), NO_BODY, None)
            .await
    }

    /// The tenant's clusters, newest first.
    pub async fn list_clusters(&self) -> Result<ClusterList, ClientError> {
        self.keyed(Method::GET, CLUSTERS, NO_BODY, None).await
    }

    /// Grows or shrinks a cluster to `resize.nodes`.
    pub async fn resize_cluster(
        &self,
        id: Uuid,
        resize: &ClusterResize,
        idempotency_key: Option<&str>,
    ) -> Result<Cluster, ClientError> {
        let path = one(CLUSTERS, id);
        self.keyed(Method::PATCH, &path, Some(resize), idempotency_key)
            .await
    }

    /// Deletes a cluster. The answer is the cluster: `deleting` while its
    /// jobs stop (poll [`Client::get_cluster`]), `deleted` once its nodes
    /// are back in the region.
    pub async fn delete_cluster(
        &self,
        id: Uuid,
        idempotency_key: Option<&str>,
    ) -> Result<Cluster, ClientError> {
        let path = one(CLUSTERS, id);
        self.keyed(Method::DELETE, &path, NO_BODY, idempotency_key)
            .await
    }

    /// The tenant's allocated GPU time.
    pub async fn usage(
        &self,
        query: &crate::api::UsageQuery,
    ) -> Result<crate::api::Usage, ClientError> {
        self.send(self.request(Method::GET, "/v1/usage").query(query))
            .await
    }

    /// The tenant's costs of `month` (`YYYY-MM`; default this month) so
    /// far, priced as the billing export prices them.
    pub async fn costs(&self, month: Option<&str>) -> Result<crate::api::Costs, ClientError> {
        let mut req = self.request(Method::GET, "/v1/costs");
        if let Some(m) = month {
            req = req.query(&[("month", m)]);
        }
        self.send(req).await
    }

    /// Every region's health and capacity (global tier).
    pub async fn regions(&self) -> Result<RegionList, ClientError> {
        self.send(self.request(Method::GET, "/v1/regions")).await
    }

    pub async fn region_status(&self) -> Result<RegionStatus, ClientError> {
        self.send(self.request(Method::GET, "/v1/region")).await
    }

    /// Sets `tenant`'s terms for `gpu_type`: guarantee, cap and weight
    /// (operators).
    pub async fn set_quota(
        &self,
        tenant: &str,
        gpu_type: &str,
        terms: &QuotaUpdate,
    ) -> Result<Quota, ClientError> {
        let req = self
            .request(
                Method::PUT,
                &format!("/v1/admin/quotas/{tenant}/{gpu_type}"),
            )
            .json(terms);
        self.send(req).await
    }

    pub async fn list_quotas(&self) -> Result<QuotaList, ClientError> {
        self.send(self.request(Method::GET, "/v1/admin/quotas"))
            .await
    }

    /// Removes a cap. Answers 204 with no body.
    pub async fn delete_quota(&self, tenant: &str, gpu_type: &str) -> Result<(), ClientError> {
        let req = self.request(
            Method::DELETE,
            &format!("/v1/admin/quotas/{tenant}/{gpu_type}"),
        );
        self.send::<serde_json::Value>(req).await.map(|_| ())
    }

    /// Sets (replaces) `tenant`'s admission limits (operators, on a
    /// region).
    pub async fn set_limits(
        &self,
        tenant: &str,
        limits: &LimitsUpdate,
    ) -> Result<TenantLimits, ClientError> {
        let req = self
            .request(Method::PUT, &format!("/v1/admin/limits/{tenant}"))
            .json(limits);
        self.send(req).await
    }

    /// Every tenant's admission limits (operators, on a region).
    pub async fn list_limits(&self) -> Result<TenantLimitsList, ClientError> {
        self.send(self.request(Method::GET, "/v1/admin/limits"))
            .await
    }

    /// Removes a tenant's admission limits. Answers 204 with no body.
    pub async fn delete_limits(&self, tenant: &str) -> Result<(), ClientError> {
        let req = self.request(Method::DELETE, &format!("/v1/admin/limits/{tenant}"));
        self.send::<serde_json::Value>(req).await.map(|_| ())
    }

    /// A region's usage ledger rows overlapping [from, to) (its own and
    /// those it holds for peers), every page (`GET /v1/admin/usage/records`;
    /// operators and the global tier).
    pub async fn usage_records(
        &self,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
        tenant: Option<&str>,
    ) -> Result<Vec<crate::billing::UsageRecord>, ClientError> {
        let mut all = Vec::new();
        let mut after: Option<Uuid> = None;
        loop {
            let mut params = vec![("from", from.to_rfc3339()), ("to", to.to_rfc3339())];
            if let Some(t) = tenant {
                params.push(("tenant", t.to_string()));
            }
            if let Some(a) = after {
                params.push(("after", a.to_string()));
            }
            let req = self
                .request(Method::GET, "/v1/admin/usage/records")
                .query(&params);
            let page: crate::billing::UsageRecords = self.send(req).await?;
            all.extend(page.records);
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(all),
            }
        }
    }

    /// `GET path` (with its query), its JSON answer as `T`: for documents
    /// without a method of their own, read without an intermediate
    /// `serde_json::Value`.
    pub async fn get_as<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.request(Method::GET, path)).await
    }

    /// Any JSON endpoint, for documents without a typed method.
    pub async fn call_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, ClientError> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req).await
    }

    /// Sends a raw body; for tests of malformed input.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> Result<serde_json::Value, ClientError> {
        let req = self
            .request(Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        self.send(req).await
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(t) = &self.tenant {
            req = req.header(TENANT_HEADER, t);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        send_json(req, &self.base).await
    }

    /// `method` on `path` with an optional JSON body and Idempotency-Key.
    async fn keyed<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        key: Option<&str>,
    ) -> Result<T, ClientError> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(k) = key {
            req = req.header(IDEMPOTENCY_KEY_HEADER, k);
        }
        self.send(req).await
    }
}

const RESERVATIONS: &str = "/v1/reservations";
const ADMIN_RESERVATIONS: &str = "/v1/admin/reservations";
const CLUSTERS: &str = "/v1/clusters";
/// No body, for [`Client::keyed`].
const NO_BODY: Option<&()> = None;

/// The path of one member of a collection.
fn one(collection: &str, id: Uuid) -> String {
    format!("{collection}/{id}")
}

/// Sends a request and decodes our JSON answer or our JSON error.
pub async fn send_json<T: DeserializeOwned>(
    req: reqwest::RequestBuilder,
    base: &str,
) -> Result<T, ClientError> {
    let resp = req.send().await.map_err(|source| ClientError::Transport {
        url: base.to_string(),
        source,
    })?;
    let status = resp.status();
    let url = resp.url().to_string();
    let retry_after = (resp.headers().get(reqwest::header::RETRY_AFTER))
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let bytes = resp
        .bytes()
        .await
        .map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
    if status == StatusCode::NO_CONTENT {
        return serde_json::from_slice(b"null").map_err(|e| ClientError::Unexpected {
            url,
            status,
            text: e.to_string(),
        });
    }
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| ClientError::Unexpected {
            url,
            status,
            text: format!("{e}: {}", String::from_utf8_lossy(&bytes)),
        });
    }
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(body) => Err(ClientError::Api {
            status,
            body,
            retry_after,
        }),
        Err(_) => Err(ClientError::Unexpected {
            url,
            status,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }),
    }
}

/// POSTs `body` as JSON to `url` and decodes the answer.
pub async fn post_json<B: Serialize, T: DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    body: &B,
) -> Result<T, ClientError> {
    send_json(http.post(url).json(body), url).await
}

/// See [`internal_client`].
pub const INTERNAL_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub const INTERNAL_KEEPALIVE: Duration = Duration::from_secs(5);
pub const INTERNAL_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
pub const INTERNAL_KEEPALIVE_PROBES: u32 = 3;
pub const INTERNAL_UNACKED_TIMEOUT: Duration = Duration::from_secs(10);

/// A client for one service of the cloud calling another (global →
/// region, agent → region, region → peer region): over HTTPS only,
/// trusting the cloud's own CA (`ca_pem`, one or more PEM certificates)
/// and nothing else; or, with `None` — only behind an operator's explicit
/// `--insecure-http` — plain HTTP. A CA that is not valid PEM is an error
/// here, at start, not at the first call.
///
/// Its connections give up on a peer that vanished without a word (its
/// machine lost power, a link was cut: nothing answers, not even a
/// refusal) in seconds rather than the kernel's minutes: a connection is
/// not made within [`INTERNAL_CONNECT_TIMEOUT`] (split among the
/// addresses a name resolves to, so a service behind two addresses
/// reaches the live one), and a pooled connection is probed after
/// [`INTERNAL_KEEPALIVE`] of silence and dropped when unanswered, or when
/// sent data goes unacknowledged for [`INTERNAL_UNACKED_TIMEOUT`] — so a
/// request is not sent down a dead one and left to its timeout.
pub fn internal_client(
    builder: reqwest::ClientBuilder,
    ca_pem: Option<&str>,
) -> Result<reqwest::Client, String> {
    let builder = builder
        .connect_timeout(INTERNAL_CONNECT_TIMEOUT)
        .tcp_keepalive(INTERNAL_KEEPALIVE)
        .tcp_keepalive_interval(INTERNAL_KEEPALIVE_INTERVAL)
        .tcp_keepalive_retries(INTERNAL_KEEPALIVE_PROBES)
        .tcp_user_timeout(INTERNAL_UNACKED_TIMEOUT);
    let builder = match ca_pem {
        Some(pem) => {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| format!("the CA certificate is not valid PEM: {e}"))?;
            if certs.is_empty() {
                return Err("the CA file holds no certificate".to_string());
            }
            let mut b = builder.tls_built_in_root_certs(false).https_only(true);
            for c in certs {
                b = b.add_root_certificate(c);
            }
            b
        }
        None => builder,
    };
    builder
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Whether `url` may be called the way the caller is configured: an
/// `https://` URL needs a CA to check it against; a plain `http://` one
/// is refused unless the operator said `--insecure-http`. `what` names the
/// setting in the error (`--peer us-west`, `--region-url`).
pub fn check_internal_url(
    url: &str,
    has_ca: bool,
    insecure: bool,
    what: &str,
) -> Result<(), String> {
    match url.split_once("://").map(|(s, _)| s) {
        Some("https") if has_ca => Ok(()),
        Some("https") => Err(format!(
            "{what} is an https:// URL but no CA was given to check its certificate: pass the CA file that signs the cloud's certificates"
        )),
        Some("http") if insecure => Ok(()),
        Some("http") => Err(format!(
            "{what} is a plain http:// URL: use https:// (with the cloud's CA), or pass --insecure-http on a network you trust"
        )),
        _ => Err(format!("{what} is not an http(s):// URL: {url:?}")),
    }
}
