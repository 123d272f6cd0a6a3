//! The region's own extractors; the generic ones live in `gangway_shared::http`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use gangway_shared::client::TENANT_HEADER;
use gangway_shared::error::codes;
pub use gangway_shared::http::{JobId, Json, Query};
use gangway_shared::ids::valid_tenant;

use super::error::ApiError;

/// The tenant the request acts for. Until the global tier authenticates
/// tenants, the region takes it from the `X-Gangway-Tenant` header.
pub struct Tenant(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let value = parts
            .headers
            .get(TENANT_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !valid_tenant(value) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_TENANT,
                "missing or malformed X-Gangway-Tenant header (1–63 characters of a-z, 0-9, '-')",
            ));
        }
        gangway_shared::http::record_tenant(value);
        Ok(Tenant(value.to_string()))
    }
}
