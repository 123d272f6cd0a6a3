//! Extractors whose every rejection is our JSON error.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use gangway_shared::client::TENANT_HEADER;
use gangway_shared::error::codes;
use gangway_shared::ids::valid_tenant;
use serde::de::DeserializeOwned;

use super::error::ApiError;

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
        Ok(Tenant(value.to_string()))
    }
}

/// A job id from the path. A malformed id names no job: 404, like any
/// job the tenant cannot see.
pub struct JobId(pub uuid::Uuid);

impl<S: Send + Sync> FromRequestParts<S> for JobId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|_| ApiError::not_found("job"))?;
        uuid::Uuid::parse_str(&raw)
            .map(JobId)
            .map_err(|_| ApiError::not_found("job"))
    }
}
