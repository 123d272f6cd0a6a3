//! Types every Gangway component agrees on.
//!
//! # Layout
//! - [`api`]: the public job API: job specs, jobs, events, list pages.
//! - [`error`]: the JSON error body and the stable error codes.
//! - [`agent`]: the protocol between a region and its node agents.
//! - [`fleet`]: the fleet file format (spines → leaves → nodes → GPUs).
//! - [`ids`]: job ids derived from (tenant, idempotency key).
//! - [`client`]: a typed HTTP client for the regional API.

pub mod agent;
pub mod api;
pub mod client;
pub mod error;
pub mod fleet;
pub mod ids;
