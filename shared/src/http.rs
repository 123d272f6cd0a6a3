//! Server-side pieces every Gangway HTTP service shares: the one API error
//! type and extractors whose every rejection is that error.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

use crate::error::{codes, ErrorBody};

/// An error answer: a status, a stable code and a message saying what to do.
/// Turning it into a response has no side effects.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The earliest window that would work, for a refused reservation
    /// (`earliest_start`, `earliest_end` of the body; see [`ErrorBody`]).
    pub earliest: Option<(DateTime<Utc>, Option<DateTime<Utc>>)>,
    /// Seconds to wait before retrying, sent as `Retry-After` (an
    /// overloaded region's 503).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            earliest: None,
            retry_after_s: None,
        }
    }

    /// The same error, telling the client when to retry (`Retry-After`).
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_s = Some(secs);
        self
    }

    /// The same error, naming the earliest window that would work.
    pub fn with_earliest(mut self, start: DateTime<Utc>, end: Option<DateTime<Utc>>) -> Self {
        self.earliest = Some((start, end));
        self
    }

    pub fn not_found(what: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            codes::NOT_FOUND,
            format!("{what} not found"),
        )
    }
}

impl From<crate::validate::Invalid> for ApiError {
    fn from(e: crate::validate::Invalid) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.code, e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code.to_string(),
            message: self.message,
            request_id: None,
            earliest_start: self.earliest.map(|(s, _)| s),
            earliest_end: self.earliest.and_then(|(_, e)| e),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_s {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        resp
    }
}

/// `axum::Json`, rejecting with our error codes.
pub struct Json<T>(pub T);

impl<S, T> FromRequest<S> for Json<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::JsonDataError(e) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!("invalid document: {}", e.body_text()),
        ),
        JsonRejection::JsonSyntaxError(e) => ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::MALFORMED_JSON,
            format!("malformed JSON: {}", e.body_text()),
        ),
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            codes::UNSUPPORTED_MEDIA_TYPE,
            "send the body as JSON with Content-Type: application/json",
        ),
        JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::PAYLOAD_TOO_LARGE,
                "request body too large",
            )
        }
        other => ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::MALFORMED_JSON,
            format!("cannot read the body: {}", other.body_text()),
        ),
    }
}

/// `axum::extract::Query`, rejecting with `invalid_query`.
pub struct Query<T>(pub T);

impl<S, T> FromRequestParts<S> for Query<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| Query(v))
            .map_err(|e: QueryRejection| {
                ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, e.body_text())
            })
    }
}

/// The `Idempotency-Key` of a create, if it has one: 1–255 printable
/// ASCII characters, else 400 `invalid_idempotency_key`.
pub fn idempotency_key(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get(crate::client::IDEMPOTENCY_KEY_HEADER) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(k) if crate::ids::valid_idempotency_key(k) => Ok(Some(k.to_string())),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_IDEMPOTENCY_KEY,
                "Idempotency-Key must be 1–255 printable ASCII characters",
            )),
        },
    }
}

/// A job spec from a JSON body, with every check that needs no fleet.
pub fn job_spec(body: serde_json::Value) -> Result<crate::api::JobSpec, ApiError> {
    let spec: crate::api::JobSpec = serde_json::from_value(body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!("invalid job spec: {e}"),
        )
    })?;
    crate::validate::check_spec(&spec)?;
    Ok(spec)
}

/// `axum::extract::Path`, rejecting with a JSON 404: a path that does not
/// decode names nothing that exists.
pub struct Path<T>(pub T);

impl<S, T> FromRequestParts<S> for Path<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| Path(v))
            .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, e.body_text()))
    }
}

/// An id extractor for `{id}` paths: a malformed id names nothing, so it
/// is 404 like one the tenant cannot see.
macro_rules! uuid_path {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        pub struct $name(pub uuid::Uuid);

        impl<S: Send + Sync> FromRequestParts<S> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                let axum::extract::Path(raw) =
                    axum::extract::Path::<String>::from_request_parts(parts, state)
                        .await
                        .map_err(|_| ApiError::not_found($what))?;
                uuid::Uuid::parse_str(&raw)
                    .map($name)
                    .map_err(|_| ApiError::not_found($what))
            }
        }
    };
}

uuid_path!(
    /// A job id from the path.
    JobId,
    "job"
);
uuid_path!(
    /// A capacity reservation id from the path.
    ReservationId,
    "reservation"
);
uuid_path!(
    /// A dedicated cluster id from the path.
    ClusterId,
    "cluster"
);

/// A JSON body as `T`, or 422 `invalid_spec` saying what is wrong with
/// the `what`.
fn body_as<T: serde::de::DeserializeOwned>(
    body: serde_json::Value,
    what: &str,
) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!("invalid {what}: {e}"),
        )
    })
}

/// A reservation request from a JSON body, with every check that needs
/// neither the fleet nor the clock.
pub fn reservation_spec(
    body: serde_json::Value,
) -> Result<crate::reservation::ReservationSpec, ApiError> {
    let spec: crate::reservation::ReservationSpec = body_as(body, "reservation")?;
    spec.check()?;
    Ok(spec)
}

/// A resize from a JSON body, checked.
pub fn reservation_resize(
    body: serde_json::Value,
) -> Result<crate::reservation::ReservationResize, ApiError> {
    let resize: crate::reservation::ReservationResize = body_as(body, "resize")?;
    resize.check()?;
    Ok(resize)
}

/// A dedicated cluster request from a JSON body, with every check that
/// needs no fleet.
pub fn cluster_spec(body: serde_json::Value) -> Result<crate::cluster::ClusterSpec, ApiError> {
    let spec: crate::cluster::ClusterSpec = body_as(body, "cluster")?;
    spec.check()?;
    Ok(spec)
}

/// A cluster resize from a JSON body, checked.
pub fn cluster_resize(body: serde_json::Value) -> Result<crate::cluster::ClusterResize, ApiError> {
    let resize: crate::cluster::ClusterResize = body_as(body, "resize")?;
    resize.check()?;
    Ok(resize)
}

/// The stable code for an error status that reached us without one (a
/// layer's or the framework's own refusal).
fn code_for_status(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => codes::NOT_FOUND,
        StatusCode::METHOD_NOT_ALLOWED => codes::METHOD_NOT_ALLOWED,
        StatusCode::REQUEST_TIMEOUT => codes::TIMEOUT,
        StatusCode::PAYLOAD_TOO_LARGE => codes::PAYLOAD_TOO_LARGE,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => codes::UNSUPPORTED_MEDIA_TYPE,
        StatusCode::UNPROCESSABLE_ENTITY => codes::INVALID_SPEC,
        s if s.is_server_error() => codes::INTERNAL,
        _ => codes::BAD_REQUEST,
    }
}

/// Makes sure every error answer is our JSON: an error response that is
/// not JSON (a timeout, a framework rejection) gets a JSON body with a code
/// derived from its status and its text as the message.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, code_for_status(status), message).into_response();
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// The request id header, set on every request (ours or a caller's valid
/// one), returned with the answer and sent on by the global tier with its
/// calls to the regions, so one id ties a request's log lines across tiers.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

tokio::task_local! {
    /// The id of the request this task serves (see [`current_request_id`]).
    static REQUEST_ID: String;
}

/// The id of the request being served, where this task serves one: the
/// global tier passes it on to the regions it calls. A task spawned off a
/// request does not inherit it.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// Notes the tenant a request acts for on its span, so every log line of
/// the request carries it (the `tenant` field of `--log-format json`).
/// Called by the extractors once they have checked who the caller is.
pub fn record_tenant(tenant: &str) {
    tracing::Span::current().record("tenant", tenant);
}

/// A caller's request id is kept if it could be ours or a tracing
/// system's (1-64 characters of letters, digits, `-`, `_`, `.`, `:`);
/// anything else is replaced, so a caller cannot put arbitrary text into
/// every log line of its request.
fn acceptable_request_id(v: &axum::http::HeaderValue) -> bool {
    let b = v.as_bytes();
    (1..=64).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'))
}

async fn drop_unacceptable_request_id(mut req: Request) -> Request {
    if req
        .headers()
        .get(REQUEST_ID_HEADER)
        .is_some_and(|v| !acceptable_request_id(v))
    {
        req.headers_mut().remove(REQUEST_ID_HEADER);
    }
    req
}

/// Counts and times every request by route (the route's template, never
/// its ids: `/v1/jobs/{id}`), method and status; notes the job id of a
/// job's route on the request's span; serves the request with its id
/// known to [`current_request_id`]; and writes an access line at debug
/// level to target `gangway::access` (`GANGWAY_LOG=info,gangway::access=debug`).
async fn observe(req: Request, next: axum::middleware::Next) -> Response {
    use axum::extract::{MatchedPath, RawPathParams};
    let started = std::time::Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let req = if route.starts_with("/v1/jobs/{id}") || route.starts_with("/v1/admin/jobs/{id}") {
        let (mut parts, body) = req.into_parts();
        if let Ok(params) = RawPathParams::from_request_parts(&mut parts, &()).await {
            if let Some((_, job)) = params.iter().find(|(k, _)| *k == "id") {
                tracing::Span::current().record("job_id", job);
            }
        }
        Request::from_parts(parts, body)
    } else {
        req
    };
    let resp = REQUEST_ID.scope(id, next.run(req)).await;
    let elapsed = started.elapsed();
    let status = resp.status().as_u16();
    metrics::counter!(
        "gangway_http_requests_total",
        "route" => route.clone(),
        "method" => method.clone(),
        "status" => status.to_string()
    )
    .increment(1);
    metrics::histogram!(
        "gangway_http_request_duration_seconds",
        "route" => route,
        "method" => method
    )
    .record(elapsed.as_secs_f64());
    tracing::debug!(
        target: "gangway::access",
        status,
        elapsed_ms = elapsed.as_secs_f64() * 1e3,
        "answered"
    );
    resp
}

/// Adds what every Gangway router has: JSON 404 and 405 answers, panics
/// caught into a JSON 500, a 30 s timeout, JSON bodies on every error, a
/// request id (`x-request-id`) set on every request, logged with it and
/// returned, and each request counted and timed by route
/// (`gangway_http_requests_total`, `gangway_http_request_duration_seconds`).
/// Log lines of a request carry its method, path, request id and, once
/// known, its tenant and job id.
pub fn finish_router(router: axum::Router) -> axum::Router {
    use axum::http::HeaderName;
    use tower_http::catch_panic::CatchPanicLayer;
    use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
    use tower_http::timeout::TimeoutLayer;
    use tower_http::trace::TraceLayer;

    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    router
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, "no such endpoint")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                codes::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method",
            )
        })
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                codes::INTERNAL,
                "internal error",
            )
            .into_response()
        }))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            std::time::Duration::from_secs(30),
        ))
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn(observe))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                let id = req
                    .headers()
                    .get(REQUEST_ID_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                let span = tracing::info_span!(
                    "request",
                    method = %req.method(),
                    path = %req.uri().path(),
                    request_id = %id,
                    tenant = tracing::field::Empty,
                    job_id = tracing::field::Empty,
                );
                // A caller's trace (the global tier's, calling a region)
                // goes on in this request's span.
                crate::otel::adopt_parent(&span, req.headers());
                span
            }),
        )
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .layer(axum::middleware::map_request(drop_unacceptable_request_id))
}

/// `k=v&…` with every value percent-encoded but for RFC 3986's unreserved
/// characters (a query string for the URLs clients and the global tier
/// build).
pub fn query_string(q: &[(&str, String)]) -> String {
    let enc = |v: &str| -> String {
        v.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let parts: Vec<String> = q.iter().map(|(k, v)| format!("{k}={}", enc(v))).collect();
    parts.join("&")
}

/// TLS on connections with `TCP_NODELAY`: an answer written as several
/// TLS records is not held back by Nagle's algorithm waiting for the
/// client's delayed ACK (tens of milliseconds a request, issue 23).
pub fn nodelay_tls(
    tls: axum_server::tls_rustls::RustlsConfig,
) -> axum_server::tls_rustls::RustlsAcceptor<axum_server::accept::NoDelayAcceptor> {
    axum_server::tls_rustls::RustlsAcceptor::new(tls)
        .acceptor(axum_server::accept::NoDelayAcceptor::new())
}
