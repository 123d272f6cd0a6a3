//! Ctrl-C and SIGTERM as a [`CancellationToken`]; SIGHUP as a reload of
//! every certificate, CA and key a server read from files ([`Reload`]).

use std::sync::{Arc, Mutex};

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

/// One part of what a SIGHUP reloads: re-reads its files and builds the
/// new material, returning what puts it in use. Building may fail (a file
/// missing, garbage PEM); putting in use may not.
pub type Prepare = Box<dyn Fn() -> anyhow::Result<Install> + Send>;
/// Puts one part's new material in use (a swap).
pub type Install = Box<dyn FnOnce() + Send>;

/// Everything a server reloads on SIGHUP — its certificate, the CAs it
/// trusts, its signing and verification keys — as one reload: every
/// part is built first, and only if all of them were are they all put in
/// use; a part that fails leaves every part as it was, and the log says
/// which and why. What was already running (open connections, requests
/// and calls in flight) keeps what it started with.
///
/// Clones share the parts, so the handler can be installed early (a
/// SIGHUP while a region waits for its database must not kill it) and
/// parts added as the server builds them.
#[derive(Clone, Default)]
pub struct Reload {
    parts: Arc<Mutex<Vec<(&'static str, Prepare)>>>,
}

impl Reload {
    /// Adds a part, `what` naming it in the log.
    pub fn part(
        &self,
        what: &'static str,
        prepare: impl Fn() -> anyhow::Result<Install> + Send + 'static,
    ) {
        self.lock().push((what, Box::new(prepare)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, Prepare)>> {
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds every part, then installs them all; the first failure
    /// installs nothing.
    pub fn run(&self) -> anyhow::Result<()> {
        let parts = self.lock();
        let mut installs = Vec::with_capacity(parts.len());
        for (what, prepare) in parts.iter() {
            installs.push(prepare().map_err(|e| e.context(*what))?);
        }
        for install in installs {
            install();
        }
        let reloaded: Vec<_> = parts.iter().map(|(w, _)| *w).collect();
        tracing::info!(?reloaded, "every part reloaded");
        Ok(())
    }

    /// Runs this reload on every SIGHUP ([`on_hangup`]), with the parts
    /// there are by then.
    pub fn on_hangup(&self) -> anyhow::Result<()> {
        let reload = self.clone();
        on_hangup("certificates and keys", move || reload.run())
    }
}
