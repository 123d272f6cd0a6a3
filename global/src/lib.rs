//! The stateless global tier: the public HTTPS API tenants meet.
//!
//! It authenticates tenants (ES256 JWTs), rate-limits them per tenant,
//! routes each request to the region that owns the job (or, for a new job,
//! to the region chosen for it), and merges regions' answers. It keeps no
//! state of its own: any replica answers any request the same way.
//!
//! # Layout
//! - [`config`]: the settings, [`GlobalConfig`].
//! - [`credentials`]: the keys and the regions' CA, reloadable (SIGHUP).
//! - [`auth`]: the `Caller` extractors (JWT, role, per-tenant rate limit).
//! - [`ratelimit`]: per-tenant token buckets (governor).
//! - [`identity`]: tenants' records and API keys, kept by a majority of
//!   regions, cached for seconds.
//! - [`regions`]: the region set: service tokens, forwarding, health.
//! - [`routing`]: rendezvous order and the choice of a region for a job.
//! - [`state`]: [`GlobalState`], what every handler shares.
//! - [`api`]: the router and handlers.
//! - [`console`]: the web console at `/`, pages built from the API's own
//!   answers (called in process with the signed-in person's credential).
//!
//! Imports point down this list, from `api` to `config`: `api` uses
//! `auth`, `state`, `regions` and `routing`; `auth` uses `state`; none of
//! those uses `api`.

pub mod api;
pub mod auth;
pub mod config;
pub mod console;
pub mod credentials;
pub mod identity;
pub mod oidc;
pub mod ratelimit;
pub mod regions;
pub mod routing;
pub mod state;

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use api::app;
pub use config::GlobalConfig;
pub use state::GlobalState;

/// Serves the global tier over HTTPS on `listener` until `shutdown`; then
/// stops accepting, gives in-flight requests up to 10 s, and stops the
/// health poller.
pub async fn serve(
    listener: std::net::TcpListener,
    config: GlobalConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = gangway_auth::tls::server_config(&config.tls_cert_pem, &config.tls_key_pem)
        .map_err(|e| anyhow::anyhow!("TLS configuration: {e}"))?;
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(tls);
    serve_with_tls(listener, config, tls, shutdown).await
}

/// [`serve`] with the certificate in `tls`, which a clone held by the
/// caller rotates in place (`reload_from_config`: new connections get the
/// new certificate, open ones carry on) — `gangway global` does so on
/// SIGHUP.
pub async fn serve_with_tls(
    listener: std::net::TcpListener,
    config: GlobalConfig,
    tls: axum_server::tls_rustls::RustlsConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_state(listener, GlobalState::new(config)?, tls, shutdown).await
}

/// [`serve_with_tls`] with a state the caller built, and so holds the
/// handle of ([`GlobalState::credentials`]): `gangway global` reloads the
/// keys and the regions' CA through it on SIGHUP.
pub async fn serve_state(
    listener: std::net::TcpListener,
    state: GlobalState,
    tls: axum_server::tls_rustls::RustlsConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tracker = TaskTracker::new();
    let loops = shutdown.child_token();
    tracker.spawn(regions::poll_health(state.regions.clone(), loops.clone()));
    for oidc in [&state.oidc_tenants, &state.oidc_operators]
        .into_iter()
        .flatten()
    {
        tracker.spawn(oidc.clone().keep_keys_fresh(loops.clone()));
    }
    // Answer only once the regions' health is known.
    state.regions.refresh_all().await;

    let handle = axum_server::Handle::new();
    let h = handle.clone();
    let s = shutdown.clone();
    tokio::spawn(async move {
        s.cancelled().await;
        h.graceful_shutdown(Some(Duration::from_secs(10)));
    });
    listener.set_nonblocking(true)?;
    tracing::info!(addr = %listener.local_addr()?, "global tier listening (https)");
    axum_server::from_tcp(listener)?
        .acceptor(gangway_shared::http::nodelay_tls(tls))
        .handle(handle)
        .serve(app(state).into_make_service())
        .await?;
    loops.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}
