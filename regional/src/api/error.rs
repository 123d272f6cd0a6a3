//! The one place the region's internal errors become API errors.

use axum::http::StatusCode;
use gangway_shared::error::codes;
pub use gangway_shared::http::ApiError;

use crate::store::StoreError;

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
            StoreError::InFlight => ApiError::new(
                StatusCode::CONFLICT,
                codes::IDEMPOTENCY_REQUEST_IN_FLIGHT,
                "a request with this Idempotency-Key is still being processed; \
                 retry in a moment and you will get its result",
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
