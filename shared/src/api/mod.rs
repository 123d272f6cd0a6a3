//! The public API's types: what tenants and operators send and what they
//! get back, a file per concern (re-exported here, so every type is
//! `api::Name`).
//!
//! Field names here are part of the public contract (see the brief): `name`,
//! `gpus`, `gpu_type`, `priority`, `estimated_duration_s`, `command` in a
//! spec; `id`, `state`, `region` in a job.
//!
//! # Layout
//! - `jobs.rs`: job specs, jobs, workers, events, pages; explain, dry run.
//! - `regions.rs`: regions' capacity and status; evacuation.
//! - `quotas.rs`: quotas and admission limits.
//! - `usage.rs`: a tenant's GPU time.
//! - `nodes.rs`: nodes, node actions, faults, the inventory.
//! - `maintenance.rs`: rolling maintenance plans.
//! - `audit.rs`: goodput and the audit log.
//! - Capacity reservations and dedicated clusters: `crate::reservation`,
//!   `crate::cluster`.

mod audit;
mod identity;
mod jobs;
mod maintenance;
mod nodes;
mod quotas;
mod regions;
mod usage;

pub use audit::*;
pub use identity::*;
pub use jobs::*;
pub use maintenance::*;
pub use nodes::*;
pub use quotas::*;
pub use regions::*;
pub use usage::*;

pub use crate::cluster::{
    Cluster, ClusterEvent, ClusterList, ClusterNode, ClusterResize, ClusterSpec, ClusterState,
};
pub use crate::reservation::{
    Reservation, ReservationList, ReservationResize, ReservationSpec, ReservationState,
};
