//! What runs on a timer. Every loop is a task started by `crate::serve_on`
//! and stopped by its shutdown token; each works through the layers below
//! (`store/`, `scheduling/`, `replication/`) and never through HTTP.
//!
//! - [`scheduler`]: leadership — [`leader`], a PostgreSQL advisory lock —
//!   and, while leading, one pass loop per pool; the leader's [`tick`]
//!   runs on the same loop.
//! - [`tick`]: the leader's tick — node health, dedicated clusters,
//!   metering, maintenance — each its own function.
//! - [`beat`]: the peers' beat — heartbeats, fencing, adoption, and the
//!   replication outbox.
//! - [`evacuation`]: planned evacuation and fail back, and balancing
//!   queued jobs to a buddy with room: the leader's loop that hands jobs
//!   over.

pub mod beat;
pub mod evacuation;
pub mod leader;
pub mod scheduler;
pub mod tick;
