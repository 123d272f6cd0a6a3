//! Load shedding: an overloaded region refuses what can wait (submissions,
//! dry runs, listings) with 503 `overloaded` and `Retry-After`, so that what
//! cannot wait — its agents' syncs, its peers' heartbeats, operators'
//! actions on nodes, cancels — still gets database connections.
//!
//! Three rules, checked on every sheddable request:
//! - At most [`SHEDDABLE_SHARE`](crate::state::SHEDDABLE_SHARE) of the pool's connections serve sheddable
//!   requests at once (a semaphore). One that finds none free waits up to
//!   [`ADMISSION_WAIT`], then is shed.
//! - When callers already queue for a connection (the pool is exhausted
//!   and as many wait as it holds), a sheddable request is shed at once:
//!   taking a permit would only lengthen the queue syncs wait in.
//! - When the agents' syncs queue for their own pool's connections
//!   (`Store::sync_conn`: all taken and as many wait as it holds), a
//!   sheddable request is shed at once: the database is too busy to hear
//!   the region's machines, and a submission would only add to its work.
//!   (Without this rule, at 40,960 GPUs, submissions ran at 86 /s on a
//!   main pool no sync needed any more while syncs waited up to 10 s.) A
//!   moment's queue is not enough: a region that has just started, its
//!   agents all registering and syncing at once, still takes jobs.
//!
//! The peers' leases have a pool of their own (`Store::lease_conn`), so a
//! region shedding load is still heard by its peers and never fences for
//! being busy.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gangway_shared::error::codes;

use super::{ApiError, AppState};

/// How long a sheddable request waits for its turn before it is shed.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(1);
/// What `Retry-After` says.
pub(crate) const RETRY_AFTER_S: u64 = 2;

/// Whether a request may be shed: work a client can send again later.
pub fn sheddable(method: &Method, path: &str) -> bool {
    match *method {
        Method::POST => matches!(
            path,
            "/v1/jobs" | "/v1/jobs/dry-run" | "/internal/v1/claims"
        ),
        // Listings and usage reads: collections, not one thing by id.
        Method::GET => {
            matches!(
                path,
                "/v1/jobs"
                    | "/v1/reservations"
                    | "/v1/clusters"
                    | "/v1/usage"
                    | "/v1/admin/nodes"
                    | "/v1/admin/audit"
                    | "/v1/admin/goodput"
                    | "/v1/admin/reservations"
                    | "/v1/admin/clusters"
                    | "/v1/admin/maintenance"
            ) || path.starts_with("/v1/admin/usage/")
        }
        _ => false,
    }
}

/// A pool whose connections are all taken and as many callers wait
/// (`store::queued_callers`: beyond a full pool).
fn queued(s: deadpool_postgres::Status) -> bool {
    crate::store::queued_callers(&s) >= s.max_size
}

/// The middleware: sheds a sheddable request when the region is overloaded.
pub async fn admit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if !sheddable(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    if queued(state.store.pool_status()) {
        return overloaded(
            &req,
            "its database connections are all taken and callers queue",
        );
    }
    if queued(state.store.sync_pool_status()) {
        return overloaded(&req, "its agents' syncs queue for the database");
    }
    let permit =
        match tokio::time::timeout(ADMISSION_WAIT, state.sheddable.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            _ => return overloaded(&req, "too many submissions and listings are in progress"),
        };
    let turn = Turn(std::sync::Arc::new(std::sync::Mutex::new(Some(permit))));
    let mut req = req;
    req.extensions_mut().insert(turn.clone());
    let resp = next.run(req).await;
    turn.give_back();
    resp
}

/// A sheddable request's turn (a permit of `AppState::sheddable`), in the
/// request's extensions: a handler that goes on to wait without holding a
/// database connection (a create waiting for its buddy) gives it back
/// early, so the turns bound the database work, not the waits.
#[derive(Clone)]
pub struct Turn(std::sync::Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>);

impl Turn {
    pub fn give_back(&self) {
        self.0.lock().expect("turn lock").take();
    }
}

fn overloaded(req: &Request, why: &str) -> Response {
    metrics::counter!("gangway_requests_shed_total", "path" => req.uri().path().to_string())
        .increment(1);
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::OVERLOADED,
        format!(
            "the region is overloaded ({why}) and sheds submissions, dry runs and listings to \
             keep its machines heard; retry in {RETRY_AFTER_S} s (see Retry-After; a create \
             with the same Idempotency-Key)"
        ),
    )
    .with_retry_after(RETRY_AFTER_S)
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As deadpool reports a pool of `max_size` with `size` connections open
    /// and `users` callers holding or waiting for one.
    fn status(max_size: usize, size: usize, users: usize) -> deadpool_postgres::Status {
        deadpool_postgres::Status {
            max_size,
            size,
            available: size.saturating_sub(users),
            waiting: users.saturating_sub(size),
        }
    }

    #[test]
    fn a_pool_queues_only_when_callers_beyond_its_full_size_fill_it_again() {
        // Two connections, three callers: one waits — a moment's queue.
        assert!(!queued(status(2, 2, 3)));
        // Four callers on a full pool of two: two wait, as many as it holds.
        assert!(queued(status(2, 2, 4)));
        // Still opening its second connection: deadpool says two wait, but
        // one of them is opening the connection it will use.
        assert!(!queued(status(2, 1, 3)));
        // Idle connections: nothing queues.
        assert!(!queued(status(2, 2, 1)));
    }

    #[test]
    fn only_work_a_client_can_send_again_is_sheddable() {
        assert!(sheddable(&Method::POST, "/v1/jobs"));
        assert!(sheddable(&Method::POST, "/v1/jobs/dry-run"));
        assert!(sheddable(&Method::POST, "/internal/v1/claims"));
        assert!(sheddable(&Method::GET, "/v1/jobs"));
        assert!(sheddable(&Method::GET, "/v1/admin/nodes"));
        assert!(sheddable(&Method::GET, "/v1/admin/usage/records"));
        // What cannot wait: agents, peers, cancels, one job, node actions.
        assert!(!sheddable(&Method::POST, "/internal/v1/agents/a1/sync"));
        assert!(!sheddable(&Method::POST, "/internal/v1/agents/register"));
        assert!(!sheddable(&Method::POST, "/internal/v1/peers/heartbeat"));
        assert!(!sheddable(&Method::POST, "/v1/jobs/x/cancel"));
        assert!(!sheddable(&Method::GET, "/v1/jobs/x"));
        assert!(!sheddable(&Method::POST, "/v1/admin/nodes/n1/drain"));
        assert!(!sheddable(&Method::GET, "/v1/region"));
    }

    #[test]
    fn sheddable_requests_leave_a_quarter_of_the_pool() {
        assert_eq!(crate::state::sheddable_turns(16).available_permits(), 12);
        assert_eq!(crate::state::sheddable_turns(1).available_permits(), 1);
    }
}
