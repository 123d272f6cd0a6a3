//! The node agent: registers its nodes with a region, syncs with it on a
//! fixed interval, and starts and stops the workers the region assigns.
//!
//! The agent pulls. Each sync reports what the region has not heard — a
//! worker it runs until the region lists it started (and again when its
//! checkpoint moves), an exit until the region stops listing the worker —
//! and gets back the full list of workers the region wants on its nodes;
//! the agent acts on the difference. Nothing is persisted: a new process gets a
//! new boot id, which tells the region that the workers of the previous boot
//! are gone.
//!
//! # Layout
//! - [`config`]: [`AgentConfig`] and [`ExecutorKind`].
//! - [`fleet`]: [`nodes_from_fleet`], the simulated nodes an agent serves
//!   in simulated mode (`--simulate FLEET_FILE`).
//! - [`identity`]: a real machine's node — its name, its GPUs (NVML, or
//!   declared on a GPU-less host) — and the claimant id sent with every
//!   registration.
//! - `agent`: [`run`], the register → sync → reconcile loop and ordered
//!   shutdown.
//! - `region`: the HTTP client for the region's agent endpoints, and the
//!   capped exponential backoff used while the region is away.
//! - `workers`: the table of this boot's workers keyed by
//!   (job, rank, attempt); reconciling it against assignments and turning it
//!   into reports. Pure bookkeeping over executor handles.
//! - `health`: the machine boot id and GPU health signals (NVML, loaded at
//!   run time; none where it does not load) reported with every sync.
//! - `checkpoints`: the checkpoint store from the agent's side: rank 0's
//!   checkpoints uploaded (manifest last) and reported until the region
//!   accepts them; a restarted worker's checkpoint fetched and verified.
//! - `executor`: one task per worker. `executor::real` runs a process in
//!   its own process group (SIGTERM, then SIGKILL after the grace period);
//!   `executor::sim` only waits out the job's scaled estimated duration.
//!
//! # The worker contract
//! A real worker runs `command` (looked up on `PATH`) in
//! `work_dir/jobs/{job_id}/rank-{rank}-attempt-{attempt}`, with stdout and
//! stderr appended to `stdout.log` and `stderr.log` there. Its environment is
//! the agent's, then the assignment's `env`, then (overriding) `GANGWAY_JOB_ID`,
//! `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
//! `CUDA_VISIBLE_DEVICES`, `GANGWAY_NODE_ID` and `GANGWAY_ATTEMPT`.

mod agent;
mod checkpoints;
pub mod config;
mod executor;
pub mod fleet;
mod health;
pub mod identity;
mod logs;
mod region;
mod workers;

pub use agent::{run, run_with_link};
pub use config::{AgentConfig, ExecutorKind, IsolationConfig, IsolationMode, SandboxBind};
pub use fleet::nodes_from_fleet;
pub use region::{PreparedLink, RegionLink};
