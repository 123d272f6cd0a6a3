//! Who is calling: tenant and admin extractors. Each verifies the bearer
//! token with its own keys (tenant tokens with `--tenant-key`, admin tokens
//! with `--operator-key`: a key vouches for one kind only), checks the
//! role, then takes one request from the caller's rate limit bucket, so
//! health, metrics and the OpenAPI document (which use no extractor) are
//! never limited.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_auth::jwt::Role;
use gangway_auth::oidc::VerifiedClaims;
use gangway_auth::AuthError;
use gangway_shared::api::KeyScope;
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;

use crate::identity::{check_tenant, verify_key, KeyRefusal, KEY_PREFIX};
use crate::oidc::{Oidc, OidcKind};
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

fn unauthenticated(e: AuthError) -> Rejection {
    Rejection::Api(ApiError::new(
        StatusCode::UNAUTHORIZED,
        e.code(),
        e.to_string(),
    ))
}

fn forbidden(message: impl Into<String>) -> Rejection {
    Rejection::Api(ApiError::new(
        StatusCode::FORBIDDEN,
        codes::FORBIDDEN,
        message,
    ))
}

/// The issuer `token` says made it, if that is `oidc`'s.
fn issued_by<'a>(oidc: &'a Option<Oidc>, token: &str) -> Option<&'a Oidc> {
    oidc.as_ref().filter(|o| o.claims_to_issue(token))
}

/// The tenant a verified token of the tenants' issuer is for: the one
/// value of its tenant claim, a valid tenant name.
fn oidc_tenant(oidc: &Oidc, claims: &VerifiedClaims) -> Result<String, Rejection> {
    let OidcKind::Tenants { tenant_claim } = &oidc.config.kind else {
        unreachable!("the tenants' issuer")
    };
    match claims.strings(tenant_claim).as_slice() {
        [tenant] if gangway_auth::valid_tenant(tenant) => Ok(tenant.to_string()),
        _ => Err(unauthenticated(AuthError::BadClaims(format!(
            "the token's `{tenant_claim}` claim must name one tenant (1-63 characters of \
             a-z, 0-9 and '-'); ask the identity provider's administrator to map it"
        )))),
    }
}

fn limit(state: &GlobalState, key: &str) -> Result<(), Rejection> {
    state.rate_limiter.check(key).map_err(|wait| {
        metrics::counter!("gangway_global_rate_limited_total").increment(1);
        Rejection::RateLimited(wait)
    })
}

/// A tenant calling about its own jobs: by a token (its own key's, or its
/// OpenID Connect issuer's), or by one of its API keys.
pub struct TenantCaller {
    pub tenant: String,
    /// The API key it called with, if it did.
    pub key_id: Option<String>,
}

impl TenantCaller {
    /// Who it is, for `created_by`: `tenant:T` or `key:ID`.
    pub fn name(&self) -> String {
        match &self.key_id {
            Some(k) => format!("key:{k}"),
            None => format!("tenant:{}", self.tenant),
        }
    }
}

/// A refused API key as the caller sees it.
fn key_refused(r: KeyRefusal) -> Rejection {
    match r {
        KeyRefusal::Unavailable(e) => Rejection::Api(e),
        KeyRefusal::Invalid(why) => Rejection::Api(ApiError::new(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHENTICATED,
            why,
        )),
    }
}

fn scope_refused(message: &str) -> Rejection {
    Rejection::Api(ApiError::new(
        StatusCode::FORBIDDEN,
        codes::KEY_SCOPE,
        message,
    ))
}

impl FromRequestParts<GlobalState> for TenantCaller {
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &GlobalState) -> Result<Self, Rejection> {
        let caller = tenant_of(parts, state).await?;
        gangway_shared::http::record_tenant(&caller.tenant);
        limit(state, &caller.tenant)?;
        check_tenant(&state.identity, &state.regions, &caller.tenant)
            .await
            .map_err(Rejection::Api)?;
        Ok(caller)
    }
}

/// The tenant the credential is for, verified (not yet rate-limited).
async fn tenant_of(parts: &Parts, state: &GlobalState) -> Result<TenantCaller, Rejection> {
    let credentials = state.credentials.current();
    let header = bearer(parts);
    let by_token = |tenant: String| TenantCaller {
        tenant,
        key_id: None,
    };
    if let Ok(token) = gangway_auth::jwt::bearer_token(header) {
        if token.starts_with(KEY_PREFIX) {
            let key = verify_key(&state.identity, &state.regions, token)
                .await
                .map_err(key_refused)?;
            let reads_only = matches!(parts.method, Method::GET | Method::HEAD);
            return match (key.scope, key.tenant) {
                (KeyScope::Admin, _) | (_, None) => Err(scope_refused(
                    "this endpoint is for tenants; an operator's API key may not use it",
                )),
                (KeyScope::Read, Some(_)) if !reads_only => Err(scope_refused(
                    "this API key may only read (scope `read`): make one with scope `submit`                      to change anything",
                )),
                (_, Some(tenant)) => Ok(TenantCaller {
                    tenant,
                    key_id: Some(key.key_id),
                }),
            };
        }
        // A token that says an OpenID Connect issuer made it goes to
        // that issuer's verifier, and only there.
        if let Some(oidc) = issued_by(&state.oidc_tenants, token) {
            let claims = oidc.verify(token).await.map_err(unauthenticated)?;
            return Ok(by_token(oidc_tenant(oidc, &claims)?));
        }
        if let Some(oidc) = issued_by(&state.oidc_operators, token) {
            oidc.verify(token).await.map_err(unauthenticated)?;
            return Err(forbidden(
                "this endpoint is for tenants; use a tenant token",
            ));
        }
    }
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
        (Role::Tenant, Some(tenant)) => Ok(by_token(tenant)),
        (Role::Admin, _) => Err(forbidden(
            "a tenant key does not vouch for admin tokens: operators' tokens are \
             signed by an operator key (--operator-key)",
        )),
        _ => Err(forbidden(
            "this endpoint is for tenants; use a tenant token",
        )),
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
        if let Ok(token) = gangway_auth::jwt::bearer_token(header) {
            if token.starts_with(KEY_PREFIX) {
                let key = verify_key(&state.identity, &state.regions, token)
                    .await
                    .map_err(key_refused)?;
                if key.scope != KeyScope::Admin {
                    return Err(scope_refused(
                        "this endpoint is for operators; a tenant's API key may not use it",
                    ));
                }
                let subject = format!("key:{}", key.key_id);
                limit(state, &format!("admin:{subject}"))?;
                return Ok(AdminCaller { subject });
            }
            if let Some(oidc) = issued_by(&state.oidc_operators, token) {
                let claims = oidc.verify(token).await.map_err(unauthenticated)?;
                if let OidcKind::Operators {
                    require: Some((claim, value)),
                } = &oidc.config.kind
                {
                    if !claims.strings(claim).contains(&value.as_str()) {
                        return Err(forbidden(format!(
                            "this token of the operators' issuer does not carry {claim} = \
                             {value:?}, which its admin endpoints require"
                        )));
                    }
                }
                limit(state, &format!("admin:{}", claims.sub))?;
                return Ok(AdminCaller {
                    subject: claims.sub,
                });
            }
            if let Some(oidc) = issued_by(&state.oidc_tenants, token) {
                oidc.verify(token).await.map_err(unauthenticated)?;
                return Err(forbidden(
                    "this endpoint is for operators; a tenant token may not use it",
                ));
            }
        }
        let tenants_token = || credentials.verifier.verify_header(header).is_ok();
        let Some(operators) = &credentials.operator_verifier else {
            if header.is_none_or(|h| h.trim().is_empty()) {
                return Err(unauthenticated(AuthError::Missing));
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
