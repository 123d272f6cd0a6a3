//! API keys: a tenant's own (`/v1/keys`) and any, by operators
//! (`/v1/admin/keys`). Made here (the secret shown once, its SHA-256 kept
//! by a majority of regions: `crate::identity`), listed with their last
//! use, revoked at once.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use gangway_shared::api::{ApiKey, ApiKeyCreate, ApiKeyCreated, ApiKeyList, KeyScope};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Json, Path, Query};
use serde::Deserialize;
use utoipa::IntoParams;

use super::responses;
use crate::auth::{AdminCaller, TenantCaller};
use crate::identity::{new_key, Kind, StoredKey};
use crate::state::GlobalState;

/// The longest a key may live.
const MAX_KEY_LIFE_S: u64 = 10 * 365 * 24 * 3600;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::INVALID_API_KEY,
        message,
    )
}

fn check_request(c: &ApiKeyCreate) -> Result<(), ApiError> {
    let name_ok = !c.name.is_empty()
        && c.name.len() <= 64
        && (c.name.bytes()).all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !name_ok {
        return Err(invalid(
            "a key's name is 1-64 letters, digits, '-', '_' or '.'",
        ));
    }
    if c.expires_in_s.is_some_and(|s| s == 0 || s > MAX_KEY_LIFE_S) {
        return Err(invalid(format!(
            "expires_in_s is 1 to {MAX_KEY_LIFE_S} (ten years); leave it out for a key that \
             does not expire"
        )));
    }
    Ok(())
}

/// Makes a key for `tenant` (`None`: an operator's key).
async fn make(
    state: &GlobalState,
    tenant: Option<String>,
    scope: KeyScope,
    c: ApiKeyCreate,
    created_by: String,
) -> Result<(StatusCode, axum::Json<ApiKeyCreated>), ApiError> {
    let (key_id, secret, secret_sha256) = new_key();
    let now = Utc::now();
    let key = ApiKey {
        key_id: key_id.clone(),
        tenant,
        name: c.name,
        scope,
        created_by: created_by.clone(),
        created_at: now,
        expires_at: (c.expires_in_s).map(|s| now + chrono::Duration::seconds(s as i64)),
        revoked_at: None,
        last_used_at: None,
    };
    let doc = serde_json::to_value(StoredKey {
        key: key.clone(),
        secret_sha256,
    })
    .expect("a key serializes");
    (state.identity)
        .write(
            &state.regions,
            Kind::Key,
            &key_id,
            0,
            doc,
            "key.create",
            &created_by,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(ApiKeyCreated { key, secret }),
    ))
}

/// The keys of one tenant (or every key), newest first.
async fn listed(state: &GlobalState, tenant: Option<&str>) -> Result<ApiKeyList, ApiError> {
    let records = (state.identity)
        .list(&state.regions, Kind::Key, tenant)
        .await?;
    let mut keys: Vec<ApiKey> = records
        .into_values()
        .filter_map(|r| {
            let mut k = serde_json::from_value::<StoredKey>(r.doc).ok()?.key;
            k.last_used_at = r.last_used_at;
            Some(k)
        })
        .collect();
    keys.sort_by_key(|k| std::cmp::Reverse(k.created_at));
    Ok(ApiKeyList { keys })
}

/// Revokes `key_id` if `may` allows its key; 404 otherwise.
async fn revoke_key(
    state: &GlobalState,
    key_id: &str,
    may: impl Fn(&ApiKey) -> bool,
    actor: &str,
) -> Result<axum::Json<ApiKey>, ApiError> {
    let not_found = || ApiError::not_found("API key");
    if !crate::identity::valid_key_id(key_id) {
        return Err(not_found());
    }
    let record = (state.identity)
        .read_fresh(&state.regions, Kind::Key, key_id)
        .await?
        .ok_or_else(not_found)?;
    let mut stored: StoredKey = serde_json::from_value(record.doc).map_err(|_| not_found())?;
    if !may(&stored.key) {
        return Err(not_found());
    }
    if stored.key.revoked_at.is_none() {
        stored.key.revoked_at = Some(Utc::now());
        let doc = serde_json::to_value(&stored).expect("a key serializes");
        (state.identity)
            .write(
                &state.regions,
                Kind::Key,
                key_id,
                record.version,
                doc,
                "key.revoke",
                actor,
            )
            .await?;
    }
    stored.key.last_used_at = record.last_used_at;
    Ok(axum::Json(stored.key))
}

/// Create an API key
///
/// A key for the calling tenant: `submit` (the default) does what the
/// tenant's token does, `read` only reads. The secret is in this answer
/// and nowhere else; use it as a bearer token. A `read` key cannot make
/// keys.
#[utoipa::path(
    post,
    path = "/v1/keys",
    operation_id = "create_key",
    tag = "keys",
    security(("bearer" = [])),
    request_body(content = ApiKeyCreate, content_type = "application/json"),
    responses(
        (status = 201, description = "The key and its secret (shown once).", body = ApiKeyCreated),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "The name, expiry or scope is not acceptable (`admin` keys are operators').",
            &[codes::INVALID_API_KEY, codes::INVALID_SPEC]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn create(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Json(c): Json<ApiKeyCreate>,
) -> Result<(StatusCode, axum::Json<ApiKeyCreated>), ApiError> {
    check_request(&c)?;
    let scope = c.scope.unwrap_or(KeyScope::Submit);
    if scope == KeyScope::Admin || c.tenant.as_ref().is_some_and(|t| *t != caller.tenant) {
        return Err(invalid(
            "a tenant makes keys for itself, with scope `read` or `submit`",
        ));
    }
    let by = caller.name();
    make(&state, Some(caller.tenant), scope, c, by).await
}

/// List API keys
///
/// The calling tenant's keys, revoked and expired ones included, with
/// when each was last used (to the minute). Never their secrets.
#[utoipa::path(
    get,
    path = "/v1/keys",
    operation_id = "list_keys",
    tag = "keys",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The keys, newest first.", body = ApiKeyList),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn list(
    State(state): State<GlobalState>,
    caller: TenantCaller,
) -> Result<axum::Json<ApiKeyList>, ApiError> {
    Ok(axum::Json(listed(&state, Some(&caller.tenant)).await?))
}

/// Revoke an API key
///
/// At once: every global replica refuses it within 5 s, the one that
/// answers this at once. Revoking a revoked key changes nothing.
#[utoipa::path(
    delete,
    path = "/v1/keys/{id}",
    operation_id = "revoke_key",
    tag = "keys",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The key's id.")),
    responses(
        (status = 200, description = "The key, revoked.", body = ApiKey),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such key of the tenant's.",
            &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn revoke(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> Result<axum::Json<ApiKey>, ApiError> {
    let tenant = caller.tenant.clone();
    let may = move |k: &ApiKey| k.tenant.as_deref() == Some(tenant.as_str());
    revoke_key(&state, &id, may, &caller.name()).await
}

/// Create an API key (operators)
///
/// For a tenant (`tenant`, scope `read` or `submit`), or an operator's
/// key (scope `admin`, no tenant) for the admin endpoints. Audited
/// (`key.create`).
#[utoipa::path(
    post,
    path = "/v1/admin/keys",
    operation_id = "admin_create_key",
    tag = "admin",
    security(("bearer" = [])),
    request_body(content = ApiKeyCreate, content_type = "application/json"),
    responses(
        (status = 201, description = "The key and its secret (shown once).", body = ApiKeyCreated),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "The name, expiry, scope or tenant is not acceptable.",
            &[codes::INVALID_API_KEY, codes::INVALID_SPEC]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn admin_create(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Json(c): Json<ApiKeyCreate>,
) -> Result<(StatusCode, axum::Json<ApiKeyCreated>), ApiError> {
    check_request(&c)?;
    let scope = c.scope.unwrap_or(KeyScope::Submit);
    let tenant = match (scope, c.tenant.clone()) {
        (KeyScope::Admin, None) => None,
        (KeyScope::Admin, Some(_)) => {
            return Err(invalid("an `admin` key is an operator's: name no tenant"))
        }
        (_, Some(t)) if gangway_shared::ids::valid_tenant(&t) => Some(t),
        (_, _) => {
            return Err(invalid(
                "a `read` or `submit` key names its tenant (1-63 characters of a-z, 0-9, '-')",
            ))
        }
    };
    make(&state, tenant, scope, c, admin.subject).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct KeysParam {
    /// Only this tenant's keys.
    tenant: Option<String>,
}

/// List API keys (operators)
///
/// Every key, or one tenant's, with its last use. Never the secrets.
#[utoipa::path(
    get,
    path = "/v1/admin/keys",
    operation_id = "admin_list_keys",
    tag = "admin",
    security(("bearer" = [])),
    params(KeysParam),
    responses(
        (status = 200, description = "The keys, newest first.", body = ApiKeyList),
        (status = 400, description = responses::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn admin_list(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Query(p): Query<KeysParam>,
) -> Result<axum::Json<ApiKeyList>, ApiError> {
    Ok(axum::Json(listed(&state, p.tenant.as_deref()).await?))
}

/// Revoke an API key (operators)
///
/// Any key, a tenant's or an operator's; audited (`key.revoke`).
#[utoipa::path(
    delete,
    path = "/v1/admin/keys/{id}",
    operation_id = "admin_revoke_key",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The key's id.")),
    responses(
        (status = 200, description = "The key, revoked.", body = ApiKey),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such key.",
            &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn admin_revoke(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
) -> Result<axum::Json<ApiKey>, ApiError> {
    revoke_key(&state, &id, |_| true, &admin.subject).await
}
