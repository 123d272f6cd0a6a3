//! The one place internal errors become API errors. Turning an error into a
//! response has no side effects beyond a log line for 5xx.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gangway_shared::error::{codes, ErrorBody};

use crate::store::StoreError;
use crate::validate::Invalid;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn not_found(what: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            codes::NOT_FOUND,
            format!("{what} not found"),
        )
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.code, e.message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::not_found("job"),
            StoreError::KeyReused => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was already used with a different job spec; \
                 use a new key for a new job",
            ),
            StoreError::UnknownAgent => ApiError::new(
                StatusCode::NOT_FOUND,
                codes::UNKNOWN_AGENT,
                "agent not registered; register again",
            ),
            StoreError::StaleBoot => ApiError::new(
                StatusCode::CONFLICT,
                codes::STALE_BOOT,
                "report from an earlier boot of this agent; register again",
            ),
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::UNAVAILABLE,
                    "the region's database is unavailable; retry shortly",
                )
            }
            e => {
                tracing::error!(error = %e, "internal error");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    codes::INTERNAL,
                    "internal error",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code.to_string(),
            message: self.message,
            request_id: None,
        };
        (self.status, Json(body)).into_response()
    }
}
