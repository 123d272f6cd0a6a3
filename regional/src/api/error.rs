//! The one place the region's internal errors become API errors.

use axum::http::StatusCode;
use gangway_shared::error::codes;
pub use gangway_shared::http::ApiError;

use crate::store::StoreError;

/// When a client should retry after the database was unavailable: about
/// the time a Patroni failover takes to give writes back (docs/operations.md).
pub const DATABASE_RETRY_AFTER_S: u64 = 2;

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
            // The create handler answers this itself (with
            // `X-Gangway-Claim: elsewhere`, for the global tier); anywhere
            // else it is a retry's business, like a request in flight.
            StoreError::ClaimedElsewhere => ApiError::new(
                StatusCode::CONFLICT,
                codes::IDEMPOTENCY_REQUEST_IN_FLIGHT,
                "this Idempotency-Key is claimed for another region; retry and the global \
                 tier sends the create there",
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
            StoreError::QueuedJobsLimit {
                region,
                limit,
                queued,
            } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::QUEUED_JOBS_LIMIT,
                if limit == 0 {
                    format!(
                        "your tenant may have no queued jobs in region {region} (max_queued_jobs \
                         is 0), so nothing was created; ask an operator to raise the limit"
                    )
                } else {
                    format!(
                        "you already have {queued} queued job(s) in region {region}, and your \
                         limit there is {limit} (max_queued_jobs), so nothing was created; \
                         submit again once some have started or finished, cancel some, or ask \
                         an operator to raise the limit"
                    )
                },
            ),
            StoreError::RequestedGpusLimit {
                region,
                limit,
                unfinished_gpus,
                job_gpus,
            } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::REQUESTED_GPUS_LIMIT,
                if job_gpus > u64::from(limit) {
                    format!(
                        "this job asks for {job_gpus} GPUs, more than your limit of {limit} GPUs \
                         for unfinished jobs in region {region} (max_gpus) even with no other \
                         job, so nothing was created; ask for fewer GPUs, or ask an operator to \
                         raise the limit"
                    )
                } else {
                    format!(
                        "this job asks for {job_gpus} GPUs and your unfinished jobs in region \
                         {region} already ask for {unfinished_gpus}: {} in all, over your limit \
                         of {limit} (max_gpus), so nothing was created; submit again once some \
                         have finished, cancel some, ask for fewer GPUs, or ask an operator to \
                         raise the limit",
                        unfinished_gpus + job_gpus
                    )
                },
            ),
            StoreError::ReservationRefused { why, earliest } => {
                let next = match earliest {
                    Some((s, Some(e))) => format!(
                        "; the earliest window of the same length that would work is [{}, {}): \
                         ask for that, or for fewer GPUs or a wider level",
                        s.to_rfc3339(),
                        e.to_rfc3339()
                    ),
                    Some((s, None)) => format!(
                        "; the earliest open-ended start that would work is {}: ask for that, \
                         or for fewer GPUs or a wider level",
                        s.to_rfc3339()
                    ),
                    None => "; no later window of the same length would work either: ask for \
                             fewer GPUs or a wider level"
                        .to_string(),
                };
                let err = ApiError::new(
                    StatusCode::CONFLICT,
                    codes::RESERVATION_UNAVAILABLE,
                    format!("the reservation cannot be honoured, so nothing changed: {why}{next}"),
                );
                match earliest {
                    Some((s, e)) => err.with_earliest(s, e),
                    None => err,
                }
            }
            StoreError::Invalid { code, message } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
            }
            StoreError::Conflict { code, message } => {
                ApiError::new(StatusCode::CONFLICT, code, message)
            }
            StoreError::Refused { code, message } => {
                ApiError::new(StatusCode::FORBIDDEN, code, message)
            }
            // No connection within the pool's wait: the database is
            // there, the region is busy. Overloaded, as when it sheds.
            // (A connection that could not be made in time is the
            // database not answering: unavailable, below.)
            StoreError::Pool(deadpool_postgres::PoolError::Timeout(
                deadpool_postgres::TimeoutType::Wait,
            )) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::OVERLOADED,
                format!(
                    "the region is overloaded (no database connection came free in time); \
                     retry in {} s (see Retry-After; a create with the same Idempotency-Key)",
                    super::shed::RETRY_AFTER_S
                ),
            )
            .with_retry_after(super::shed::RETRY_AFTER_S),
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::UNAVAILABLE,
                    format!(
                        "the region's database is unavailable (failing over, or unreachable); \
                         retry in {DATABASE_RETRY_AFTER_S} s (see Retry-After; a create with the \
                         same Idempotency-Key)"
                    ),
                )
                .with_retry_after(DATABASE_RETRY_AFTER_S)
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
