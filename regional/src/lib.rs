//! The regional control plane: one region's API, scheduling loop and store.
//!
//! # Layout
//!
//! Layers, each a folder (or a file), with imports pointing only down the
//! list — a layer calls those below it, never one above:
//!
//! - [`api`]: HTTP — the axum router (`/v1` jobs, `/internal/v1` agents
//!   and peers), its handlers, authentication, shedding, validation.
//! - [`loops`]: what runs on a timer — leadership and the scheduling pass
//!   loops, the leader's tick (node health, clusters, metering,
//!   maintenance), the peers' beat (heartbeats, fencing, adoption, the
//!   outbox), evacuation and balancing.
//! - [`state`]: [`AppState`], what handlers and loops share.
//! - [`replication`]: every call to another region — the peer client
//!   (`replication::peers`), a new job's intent handed to a buddy,
//!   adoption of a dead region's jobs, moves learned, checkpoints copied,
//!   and `replication::outbox`, what the leader keeps its peers told of
//!   later (updates, usage, credits, placements, commitments), one loop for
//!   every kind.
//! - [`scheduling`]: one scheduling pass (snapshot → the pure
//!   `gangway-sched` core → checked commit), and explain / dry run.
//! - [`store`]: the database — SQL in, domain types out (schema in
//!   `migrations/`, the SQL functions' live bodies in
//!   `sql/functions.sql`); no HTTP, no other region.
//! - [`config`]: [`RegionConfig`], every knob with its unit;
//!   [`credentials`], the verifier, the peer signing key and the client
//!   to the peers as in use now (reloaded on SIGHUP); and [`telemetry`],
//!   the Prometheus recorder and metric descriptions.
//!
//! The pure crates below all of it: `gangway-sched` (placement and policy)
//! and `gangway-health` (node health).

pub mod api;
pub mod config;
pub mod credentials;
pub mod loops;
pub mod replication;
pub mod scheduling;
pub mod state;
pub mod store;
pub mod telemetry;

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use api::app;
pub use config::RegionConfig;
pub use state::AppState;
pub use store::Store;

/// Connects to the database (waiting up to `db_wait` for it), migrates,
/// and returns the state the server runs on.
/// Refuses a configuration the region cannot run safely with
/// ([`RegionConfig::validate`]: the agents' lease against the health
/// policy's `lost_after_s`).
pub async fn prepare(config: RegionConfig, db_wait: Duration) -> anyhow::Result<AppState> {
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid region configuration: {e}"))?;
    let store = Store::connect(&config.database_url, &config.region, config.pool_size)?
        .with_health(config.health.clone(), config.checkpoint_deadline)
        .with_replication(!config.peers.peers.is_empty())
        // An agent holds its nodes against another claimant for its lease.
        .with_claim_lease(
            config
                .fencing()
                .map_or(config.agent_timeout, |f| f.fence_after),
        );
    let deadline = tokio::time::Instant::now() + db_wait;
    loop {
        match store.migrate().await {
            Ok(()) => break,
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "waiting for the database");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("cannot prepare the region's database: {e}")),
        }
    }
    Ok(AppState::new(store, config))
}

/// Serves the regional control plane until `shutdown`: stops accepting,
/// finishes in-flight requests, then stops the scheduling loop.
pub async fn serve(state: AppState, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(state.config.listen).await?;
    let scheme = if state.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(region = %state.store.region(), addr = %listener.local_addr()?, scheme, "region listening");
    serve_on(listener, state, shutdown).await
}

/// Like [`serve`], on a listener the caller bound: over TLS when the
/// configuration has the region's certificate ([`RegionConfig::tls`]),
/// else plain HTTP.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tracker = TaskTracker::new();
    let loops = shutdown.child_token();
    tracker.spawn(loops::scheduler::run_loop(state.clone(), loops.clone()));
    tracker.spawn(loops::beat::run_loop(state.clone(), loops.clone()));
    tracker.spawn(loops::evacuation::run_loop(state.clone(), loops.clone()));
    let server_shutdown = shutdown.clone();
    match state.config.tls.clone() {
        Some(tls) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let handle = axum_server::Handle::new();
            let h = handle.clone();
            tokio::spawn(async move {
                server_shutdown.cancelled().await;
                // As the plain server: every request under way finishes.
                h.graceful_shutdown(None);
            });
            axum_server::from_tcp(listener.into_std()?)?
                .acceptor(gangway_shared::http::nodelay_tls(tls))
                .handle(handle)
                .serve(app(state).into_make_service())
                .await?;
        }
        None => {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app(state))
                .with_graceful_shutdown(async move { server_shutdown.cancelled().await })
                .await?;
        }
    }
    loops.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}
