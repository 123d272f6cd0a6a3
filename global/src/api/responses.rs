//! What the OpenAPI document says of answers that many operations share:
//! the error responses (401, 403, 429, 404 per kind, refusals, 503,
//! 413, 415) with the codes each carries, the schemas that stand for
//! regions' answers passed on as they are, and the `Idempotency-Key`
//! header. Handlers name these in their `#[utoipa::path]`; the document
//! itself is `openapi.rs`.

use gangway_auth::error::AuthError;
use gangway_shared::api::{AuditList, NodeList, Quota, QuotaList, TenantLimits, TenantLimitsList};
use gangway_shared::error::{codes, ErrorBody};
use serde::Serialize;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{IntoParams, ToResponse, ToSchema};

/// Codes a 401 carries: one per way the authenticator refuses a token.
pub fn auth_codes() -> Vec<&'static str> {
    // No wildcard: a new way to refuse a token fails to compile here until
    // it is listed below, so the document cannot miss its code.
    let _listed = |e: &AuthError| match e {
        AuthError::Missing
        | AuthError::Malformed(_)
        | AuthError::UnsupportedAlgorithm(_)
        | AuthError::UnknownKey(_)
        | AuthError::BadSignature
        | AuthError::Expired { .. }
        | AuthError::NotYetValid { .. }
        | AuthError::WrongAudience { .. }
        | AuthError::WrongIssuer { .. }
        | AuthError::BadClaims(_)
        | AuthError::Key(_) => (),
    };
    let none = String::new;
    [
        AuthError::Missing,
        AuthError::Malformed(none()),
        AuthError::UnsupportedAlgorithm(none()),
        AuthError::UnknownKey(none()),
        AuthError::BadSignature,
        AuthError::Expired { expired_at: 0 },
        AuthError::NotYetValid { not_before: 0 },
        AuthError::WrongAudience {
            expected: none(),
            found: none(),
        },
        AuthError::WrongIssuer {
            expected: none(),
            found: none(),
        },
        AuthError::BadClaims(none()),
        AuthError::Key(none()),
    ]
    .iter()
    .map(AuthError::code)
    .collect()
}

/// `what`, followed by the codes the answer carries.
pub(crate) fn errors(what: &str, codes: &[&str]) -> String {
    let list: Vec<String> = codes.iter().map(|c| format!("`{c}`")).collect();
    format!("{what} Codes: {}.", list.join(", "))
}

fn error_response(description: String) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ErrorBody")))
            .build(),
    )
}

fn integer_header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(
            ObjectBuilder::new().schema_type(Type::Integer).build(),
        ))
        .description(Some(description))
        .build()
}

pub(super) fn string_header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::String).build()))
        .description(Some(description))
        .build()
}

/// 401: no token, or one that does not verify.
pub struct Unauthenticated;

impl<'r> ToResponse<'r> for Unauthenticated {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "No valid bearer token: it is missing, malformed, not ES256, signed by an \
             unknown key or not at all, expired, not yet valid, or for another audience or \
             issuer. The code says which; get a new token.",
            &auth_codes(),
        );
        let response = error_response(text)
            .header(
                "WWW-Authenticate",
                string_header("`Bearer realm=\"gangway\"`"),
            )
            .build();
        ("Unauthenticated", response.into())
    }
}

/// 403: a valid token whose role may not call the endpoint.
pub struct Forbidden;

impl<'r> ToResponse<'r> for Forbidden {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "The token is valid but its role may not call this endpoint: jobs and \
             regions take tenant tokens, admin endpoints admin tokens (`forbidden`); an API \
             key's scope does not allow it (`key_scope`: a `read` key changes nothing, a \
             tenant's key calls no admin endpoint); or the tenant is suspended by an \
             operator (`tenant_suspended`).",
            &[codes::FORBIDDEN, codes::KEY_SCOPE, codes::TENANT_SUSPENDED],
        );
        ("Forbidden", error_response(text).build().into())
    }
}

/// 429: the caller's rate limit is spent.
pub struct RateLimited;

impl<'r> ToResponse<'r> for RateLimited {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "Too many requests from this tenant (or operator); other tenants are not \
             affected. Retry after the `Retry-After` header's seconds.",
            &[codes::RATE_LIMITED],
        );
        let response = error_response(text)
            .header(
                "Retry-After",
                integer_header("Seconds to wait before retrying."),
            )
            .build();
        ("RateLimited", response.into())
    }
}

/// 429 on a create (or its dry run): the rate limit, or the tenant's
/// admission limits in the region the job went to.
pub struct CreateRefused;

impl<'r> ToResponse<'r> for CreateRefused {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "Too many requests from this tenant: retry after the `Retry-After` header's \
             seconds (`rate_limited`). Or the job would put the tenant over its admission \
             limits in the region it went to: as many jobs queued as its limit allows \
             (`queued_jobs_limit`), or more GPUs asked by its unfinished jobs than its limit \
             (`requested_gpus_limit`); nothing was created, no `Retry-After` is sent, and the \
             message gives the limit and the count. Submit again once jobs have started or \
             finished, cancel some, ask for fewer GPUs, or ask an operator to raise the \
             limits.",
            &[
                codes::RATE_LIMITED,
                codes::QUEUED_JOBS_LIMIT,
                codes::REQUESTED_GPUS_LIMIT,
            ],
        );
        let response = error_response(text)
            .header(
                "Retry-After",
                integer_header("Seconds to wait before retrying (`rate_limited` only)."),
            )
            .build();
        ("CreateRefused", response.into())
    }
}

/// A 404 for an id of `what` (`a job`, `a reservation`, …), named `name`.
fn not_found<'r>(name: &'r str, what: &str) -> (&'r str, RefOr<utoipa::openapi::Response>) {
    let text = errors(
        &format!(
            "No such {what} for this tenant. A malformed id, an unknown id and another \
             tenant's {what} all answer the same."
        ),
        &[codes::NOT_FOUND],
    );
    (name, error_response(text).build().into())
}

/// 404 for a job id.
pub struct JobNotFound;

impl<'r> ToResponse<'r> for JobNotFound {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        not_found("JobNotFound", "job")
    }
}

/// 404 for a reservation id.
pub struct ReservationNotFound;

impl<'r> ToResponse<'r> for ReservationNotFound {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        not_found("ReservationNotFound", "reservation")
    }
}

/// 404 for a dedicated cluster id (operators: any tenant's).
pub struct ClusterNotFound;

impl<'r> ToResponse<'r> for ClusterNotFound {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        not_found("ClusterNotFound", "cluster")
    }
}

/// 409 on a reservation's create or resize.
pub struct ReservationRefused;

impl<'r> ToResponse<'r> for ReservationRefused {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "The reservation cannot be honoured as asked (`reservation_unavailable`): no \
             domain of the level keeps that many GPUs unreserved for the whole window (for a \
             resize: the domain it is pinned to). Nothing was created or changed. The \
             message says why; `earliest_start` and `earliest_end` (absent for an \
             open-ended window) give the earliest window of the same length that would \
             work, and are absent when none would: ask for that window, fewer GPUs or a \
             wider level. Or the reservation is deleted or over, or the new size is below \
             what its running jobs hold (`reservation_conflict`).",
            &[codes::RESERVATION_UNAVAILABLE, codes::RESERVATION_CONFLICT],
        );
        ("ReservationRefused", error_response(text).build().into())
    }
}

/// 409 on a dedicated cluster's create or resize.
pub struct ClusterRefused;

impl<'r> ToResponse<'r> for ClusterRefused {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "The cluster cannot be made (or grown) as asked (`cluster_unavailable`): no \
             domain of the level has that many free whole nodes of the type (none running \
             work, spares excluded; for a resize: inside the cluster's domain), or taking \
             them would break a capacity reservation's promise. Nothing was bound; the \
             message says why and how many are free: ask for fewer nodes or a wider level, \
             or try again when work finishes. Or the cluster is being deleted or is gone \
             (`cluster_conflict`), or another request with the same Idempotency-Key is \
             still being processed (`idempotency_request_in_flight`: retry in a moment).",
            &[
                codes::CLUSTER_UNAVAILABLE,
                codes::CLUSTER_CONFLICT,
                codes::IDEMPOTENCY_REQUEST_IN_FLIGHT,
            ],
        );
        ("ClusterRefused", error_response(text).build().into())
    }
}

/// 503 when the region that holds (or might hold) a job does not answer.
pub struct RegionUnavailable;

impl<'r> ToResponse<'r> for RegionUnavailable {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "A region that holds or might hold the job is not answering, or its \
             database is unavailable; retry shortly. An overloaded region sheds \
             submissions, dry runs and listings (`overloaded`) with a `Retry-After` \
             header: retry after its seconds (a create with the same Idempotency-Key).",
            &[
                codes::REGION_UNAVAILABLE,
                codes::UNAVAILABLE,
                codes::OVERLOADED,
            ],
        );
        (
            "RegionUnavailable",
            error_response(text)
                .header(
                    "Retry-After",
                    integer_header("Seconds to wait before retrying (`overloaded` only)."),
                )
                .build()
                .into(),
        )
    }
}

/// 503 when too few regions answer to read or write tenants and keys.
pub struct IdentityUnavailable;

impl<'r> ToResponse<'r> for IdentityUnavailable {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "Tenants' records and API keys are kept by a majority of regions, and too few \
             answered; retry after the `Retry-After` seconds. An API key is refused the same \
             way while no majority answers.",
            &[codes::IDENTITY_UNAVAILABLE],
        );
        (
            "IdentityUnavailable",
            error_response(text)
                .header(
                    "Retry-After",
                    integer_header("Seconds to wait before retrying."),
                )
                .build()
                .into(),
        )
    }
}

/// 413: the body is over the limit (1 MiB).
pub struct PayloadTooLarge;

impl<'r> ToResponse<'r> for PayloadTooLarge {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "The body is larger than 1 MiB.",
            &[codes::PAYLOAD_TOO_LARGE],
        );
        ("PayloadTooLarge", error_response(text).build().into())
    }
}

/// 415: the body is not sent as JSON.
pub struct UnsupportedMediaType;

impl<'r> ToResponse<'r> for UnsupportedMediaType {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        let text = errors(
            "The body must be sent with `Content-Type: application/json`.",
            &[codes::UNSUPPORTED_MEDIA_TYPE],
        );
        ("UnsupportedMediaType", error_response(text).build().into())
    }
}

/// One region's answer to an operator call, passed on as the region gave
/// it: a quota or limits list (list), the quota or limits set (put),
/// `{"deleted": true}` (delete), or an error (including
/// `region_unavailable` when the region did not answer).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a schema only: admin.rs passes regions' JSON on as it is
pub enum RegionAnswer {
    Nodes(NodeList),
    Audit(AuditList),
    Quotas(QuotaList),
    Quota(Quota),
    Limits(TenantLimitsList),
    TenantLimits(TenantLimits),
    Deleted(Deleted),
    Error(ErrorBody),
}

/// A region deleted the quota (or the limits).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct Deleted {
    /// Always `true`.
    deleted: bool,
}

/// The header that makes a create safe to retry (parsed in `jobs::create`).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // a parameter's description only
pub struct IdempotencyKey {
    /// 1–255 printable ASCII characters, unique per job the tenant means to
    /// create. Retrying with the same key and body returns the first
    /// attempt's job, through any replica; keys are kept at least 24 hours.
    /// The same key with another body is refused (`idempotency_key_reused`).
    #[param(
        rename = "Idempotency-Key",
        value_type = String,
        required = false,
        min_length = 1,
        max_length = 255,
        pattern = "^[\\x20-\\x7e]+$"
    )]
    idempotency_key: Option<String>,
}
