//! Who is calling: tenant and admin extractors. Each verifies the bearer
//! token, checks the role, then takes one request from the caller's rate
//! limit bucket, so health, metrics and the OpenAPI document (which use no
//! extractor) are never limited.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_auth::jwt::{Claims, Role};
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;

use crate::api::GlobalState;

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

/// Most entries a [`TokenCache`] holds (a few MB at most).
const TOKEN_CACHE_MAX: usize = 4096;

/// Tokens that verified, by their `Authorization` header value, until their
/// `exp`. Checking an ES256 signature costs about 250 µs of CPU, the largest
/// single cost of a request in the global tier (docs/benchmarks.md); a hit
/// is a hash lookup.
///
/// A hit always gives the answer the verifier would give: only tokens that
/// passed every check go in, what was checked (signature, key, issuer,
/// audience, claims) is fixed by the token's bytes, and a hit counts only
/// before `exp` — without the verifier's leeway, so from `exp` on the full
/// check runs again, leeway and all. Nothing that fails is cached, so a
/// flood of bad tokens costs what it did before.
pub struct TokenCache {
    map: Mutex<HashMap<Box<str>, Claims>>,
}

impl TokenCache {
    pub fn new() -> Self {
        TokenCache {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, authorization: &str, now: i64) -> Option<Claims> {
        let map = self.map.lock().expect("token cache lock");
        map.get(authorization).filter(|c| now < c.exp).cloned()
    }

    fn insert(&self, authorization: &str, claims: &Claims, now: i64) {
        let mut map = self.map.lock().expect("token cache lock");
        if map.len() >= TOKEN_CACHE_MAX {
            map.retain(|_, c| now < c.exp);
            if map.len() >= TOKEN_CACHE_MAX {
                map.clear();
            }
        }
        map.insert(authorization.into(), claims.clone());
    }
}

impl Default for TokenCache {
    fn default() -> Self {
        Self::new()
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn verify(parts: &Parts, state: &GlobalState) -> Result<Claims, Rejection> {
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let cache = &state.rate_limiter.tokens;
    let now = unix_now();
    if let Some(claims) = header.and_then(|h| cache.get(h, now)) {
        return Ok(claims);
    }
    let claims = state.verifier.verify_header(header).map_err(|e| {
        Rejection::Api(ApiError::new(
            StatusCode::UNAUTHORIZED,
            e.code(),
            e.to_string(),
        ))
    })?;
    if let Some(h) = header {
        cache.insert(h, &claims, now);
    }
    Ok(claims)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: i64) -> Claims {
        Claims {
            iss: "iss".into(),
            aud: "aud".into(),
            sub: "someone".into(),
            exp,
            nbf: 0,
            iat: 0,
            role: Role::Tenant,
            tenant: Some("acme".into()),
            region: None,
        }
    }

    #[test]
    fn a_cached_token_counts_only_before_its_expiry() {
        let cache = TokenCache::new();
        cache.insert("Bearer a", &claims(100), 50);
        assert_eq!(cache.get("Bearer a", 99), Some(claims(100)));
        // From `exp` on, the verifier decides again (with its leeway).
        assert_eq!(cache.get("Bearer a", 100), None);
        assert_eq!(cache.get("Bearer b", 50), None);
    }

    #[test]
    fn a_full_cache_drops_expired_tokens_first_and_stays_bounded() {
        let cache = TokenCache::new();
        for i in 0..TOKEN_CACHE_MAX {
            // Half of them expired by t = 20.
            let exp = if i % 2 == 0 { 10 } else { 1000 };
            cache.insert(&format!("Bearer {i}"), &claims(exp), 0);
        }
        cache.insert("Bearer new", &claims(1000), 20);
        assert_eq!(cache.get("Bearer 1", 20), Some(claims(1000)));
        assert_eq!(cache.get("Bearer new", 20), Some(claims(1000)));
        assert_eq!(
            cache.map.lock().unwrap().len(),
            TOKEN_CACHE_MAX / 2 + 1,
            "expired entries went, live ones stayed"
        );
        // Full of live tokens: it starts over rather than grow.
        let cache = TokenCache::new();
        for i in 0..=TOKEN_CACHE_MAX {
            cache.insert(&format!("Bearer {i}"), &claims(1000), 0);
        }
        assert!(cache.map.lock().unwrap().len() <= TOKEN_CACHE_MAX);
    }
}
