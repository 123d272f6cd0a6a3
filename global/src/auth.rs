//! Who is calling: tenant and admin extractors. Each verifies the bearer
//! token, checks the role, then takes one request from the caller's rate
//! limit bucket, so health, metrics and the OpenAPI document (which use no
//! extractor) are never limited.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_auth::jwt::{Claims, Role};
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;

use crate::state::GlobalState;

/// A rejected caller.
pub enum Rejection {
    Api(ApiError),
    RateLimited(Duration),
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Rejection::Api(e) => {
                let unauthenticated = e.status == StatusCode::UNAUTHORIZED;
                let mut resp = e.into_response();
                if unauthenticated {
                    resp.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Bearer realm=\"gangway\""),
                    );
                }
                resp
            }
            Rejection::RateLimited(wait) => {
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                let mut resp = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    codes::RATE_LIMITED,
                    format!("too many requests; retry in {secs} s (see Retry-After)"),
                )
                .into_response();
                resp.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_str(&secs.to_string()).expect("digits are a valid header"),
                );
                resp
            }
        }
    }
}

/// Verifies the bearer token. The verifier remembers tokens that passed
/// until their `exp` (`gangway_auth::jwt::Verifier::verify_at`), so a
/// tenant's repeated token costs a hash lookup, not an ES256 check. The
/// verifier is the one in use when the request came in; a reload (SIGHUP)
/// builds a new one, which remembers nothing.
fn verify(parts: &Parts, state: &GlobalState) -> Result<Claims, Rejection> {
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let credentials = state.credentials.current();
    credentials.verifier.verify_header(header).map_err(|e| {
        Rejection::Api(ApiError::new(
            StatusCode::UNAUTHORIZED,
            e.code(),
            e.to_string(),
        ))
    })
}

fn limit(state: &GlobalState, key: &str) -> Result<(), Rejection> {
    state.rate_limiter.check(key).map_err(|wait| {
        metrics::counter!("gangway_global_rate_limited_total").increment(1);
        Rejection::RateLimited(wait)
    })
}

/// A tenant calling about its own jobs.
pub struct TenantCaller {
    pub tenant: String,
}

impl FromRequestParts<GlobalState> for TenantCaller {
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &GlobalState) -> Result<Self, Rejection> {
        let claims = verify(parts, state)?;
        match (claims.role, claims.tenant) {
            (Role::Tenant, Some(tenant)) => {
                limit(state, &tenant)?;
                Ok(TenantCaller { tenant })
            }
            _ => Err(Rejection::Api(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::FORBIDDEN,
                "this endpoint is for tenants; use a tenant token",
            ))),
        }
    }
}

/// An operator.
pub struct AdminCaller {
    pub subject: String,
}

impl FromRequestParts<GlobalState> for AdminCaller {
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &GlobalState) -> Result<Self, Rejection> {
        let claims = verify(parts, state)?;
        if claims.role != Role::Admin {
            return Err(Rejection::Api(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::FORBIDDEN,
                "this endpoint is for operators; a tenant token may not use it",
            )));
        }
        limit(state, &format!("admin:{}", claims.sub))?;
        Ok(AdminCaller {
            subject: claims.sub,
        })
    }
}
