//! Ctrl-C and SIGTERM as a [`CancellationToken`]; SIGHUP as a reload.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

/// Calls `reload` on every SIGHUP for as long as the process runs: how a
/// server takes a rotated certificate without a restart. A reload that
/// fails leaves what is in use and says why. The handler is installed
/// before this returns, so a SIGHUP sent once the server is up never
/// kills it.
pub fn on_hangup(
    what: &'static str,
    reload: impl Fn() -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match reload() {
                Ok(()) => tracing::info!(what, "reloaded on SIGHUP"),
                Err(e) => tracing::warn!(
                    what,
                    error = %format!("{e:#}"),
                    "not reloaded on SIGHUP: the one in use stays"
                ),
            }
        }
    });
    Ok(())
}
