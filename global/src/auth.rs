//! Who is calling: tenant and admin extractors. Each verifies the bearer
//! token with its own keys (tenant tokens with `--tenant-key`, admin tokens
//! with `--operator-key`: a key vouches for one kind only), checks the
//! role, then takes one request from the caller's rate limit bucket, so
//! health, metrics and the OpenAPI document (which use no extractor) are
//! never limited.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_auth::jwt::Role;
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

/// The `Authorization` header's value. Tokens are verified by the tenants'
/// or the operators' verifier, as the endpoint says: each remembers tokens
/// that passed until their `exp` (`gangway_auth::jwt::Verifier::verify_at`),
/// so a caller's repeated token costs a hash lookup, not an ES256 check.
/// They are the ones in use when the request came in; a reload (SIGHUP)
/// builds new ones, which remember nothing.
fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

fn unauthenticated(e: gangway_auth::AuthError) -> Rejection {
    Rejection::Api(ApiError::new(
        StatusCode::UNAUTHORIZED,
        e.code(),
        e.to_string(),
    ))
}

fn forbidden(message: &'static str) -> Rejection {
    Rejection::Api(ApiError::new(
        StatusCode::FORBIDDEN,
        codes::FORBIDDEN,
        message,
    ))
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
        let credentials = state.credentials.current();
        let header = bearer(parts);
        let claims = match credentials.verifier.verify_header(header) {
            Ok(claims) => claims,
            // An operator's token, valid, on a tenant endpoint: say so.
            Err(_)
                if (credentials.operator_verifier.as_ref())
                    .is_some_and(|v| v.verify_header(header).is_ok()) =>
            {
                return Err(forbidden(
                    "this endpoint is for tenants; use a tenant token",
                ))
            }
            Err(e) => return Err(unauthenticated(e)),
        };
        match (claims.role, claims.tenant) {
            (Role::Tenant, Some(tenant)) => {
                limit(state, &tenant)?;
                Ok(TenantCaller { tenant })
            }
            (Role::Admin, _) => Err(forbidden(
                "a tenant key does not vouch for admin tokens: operators' tokens are \
                 signed by an operator key (--operator-key)",
            )),
            _ => Err(forbidden(
                "this endpoint is for tenants; use a tenant token",
            )),
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
        let credentials = state.credentials.current();
        let header = bearer(parts);
        let tenants_token = || credentials.verifier.verify_header(header).is_ok();
        let Some(operators) = &credentials.operator_verifier else {
            if header.is_none_or(|h| h.trim().is_empty()) {
                return Err(unauthenticated(gangway_auth::AuthError::Missing));
            }
            return Err(forbidden(
                "this global tier trusts no operator key (--operator-key): its admin \
                 endpoints answer no one",
            ));
        };
        let claims = match operators.verify_header(header) {
            Ok(claims) => claims,
            // A tenant's token, valid, on an admin endpoint: say so.
            Err(_) if tenants_token() => {
                return Err(forbidden(
                    "this endpoint is for operators; a tenant token may not use it",
                ))
            }
            Err(e) => return Err(unauthenticated(e)),
        };
        if claims.role != Role::Admin {
            return Err(forbidden("an operator key vouches for admin tokens only"));
        }
        limit(state, &format!("admin:{}", claims.sub))?;
        Ok(AdminCaller {
            subject: claims.sub,
        })
    }
}
