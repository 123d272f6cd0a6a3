//! Types every Gangway component agrees on.
//!
//! # Layout
//! - [`api`]: the public API's types, a file per concern (jobs, regions,
//!   quotas and limits, usage, nodes, maintenance, audit), every one
//!   re-exported as `api::Name`.
//! - [`reservation`]: capacity reservations' requests and views
//!   (re-exported from [`api`]).
//! - [`cluster`]: dedicated clusters' requests and views (re-exported
//!   from [`api`]). `cluster`, `reservation` and `validate` use `api`'s
//!   job types, and `api` re-exports theirs so that every public type is
//!   `api::Name`: the one import circle here, a re-export.
//! - [`billing`]: the usage ledger's records.
//! - [`error`]: the JSON error body and the stable error codes.
//! - [`agent`]: the protocol between a region and its node agents (the
//!   health signals it carries are the `gangway-signals` crate's).
//! - [`fleet`]: the fleet file format (spines → leaves → nodes → GPUs).
//! - [`ids`]: job ids derived from (tenant, idempotency key).
//! - [`validate`]: spec checks that need no fleet.
//! - [`tokens`]: token issuer and audiences.
//! - [`client`]: a typed HTTP client for the job API, and the client one
//!   service of the cloud calls another with.
//! - [`reload`]: [`reload::Reloadable`], keys and clients replaced while
//!   in use (SIGHUP).
//! - [`http`]: the API error type and extractors servers share.

pub mod agent;
pub mod api;
pub mod billing;
pub mod client;
pub mod cluster;
pub mod error;
pub mod fleet;
pub mod http;
pub mod ids;
pub mod otel;
pub mod reload;
pub mod reservation;
pub mod tokens;
pub mod validate;
