//! The agent's loop: register, then sync and reconcile until shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gangway_shared::agent::{NodeReport, RegisterRequest, SyncRequest};
use tokio::sync::Notify;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::config::{AgentConfig, ExecutorKind};
use crate::executor::Executor;
use crate::health::{machine_boot_id, spawn_nvml, Signals};
use crate::region::{is_transient, must_reregister, Backoff, RegionClient};
use crate::workers::Workers;

/// How long shutdown waits for real workers to end after SIGTERM before it
/// kills what is left, whatever their grace periods.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

/// Runs the agent until `shutdown` is cancelled, then stops its workers and
/// returns. An unreachable or failing region is logged and retried, never
/// fatal: running workers carry on meanwhile.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().context("invalid agent configuration")?;
    let boot_id = Uuid::new_v4();
    let span = tracing::info_span!(
        parent: None,
        "agent",
        agent_id = %config.agent_id,
        %boot_id,
        executor = %config.executor,
    );
    Agent::new(config, boot_id)?
        .run(shutdown)
        .instrument(span)
        .await;
    Ok(())
}

struct Agent {
    config: AgentConfig,
    boot_id: Uuid,
    /// The machine's boot id, reported for every node.
    machine_boot: String,
    /// Health signals not yet accepted by the region (one node: the
    /// machine's; a multi-node simulated agent reports none).
    signals: Signals,
    region: RegionClient,
    exited: Arc<Notify>,
    backoff: Backoff,
}

impl Agent {
    fn new(config: AgentConfig, boot_id: Uuid) -> anyhow::Result<Self> {
        let region = RegionClient::new(&config.region_url, config.token.as_deref())
            .context("building the HTTP client")?;
        let seed = boot_id.as_u64_pair().0;
        let machine_boot = machine_boot_id(
            config.machine_boot_id.as_deref(),
            config.executor == ExecutorKind::Real,
            &boot_id.to_string(),
        );
        Ok(Agent {
            config,
            boot_id,
            machine_boot,
            signals: Signals::default(),
            region,
            exited: Arc::new(Notify::new()),
            backoff: Backoff::new(seed),
        })
    }

    async fn run(mut self, shutdown: CancellationToken) {
        let executor = Executor {
            kind: self.config.executor,
            time_factor: self.config.time_factor,
            work_dir: self.config.work_dir.clone(),
            agent_id: self.config.agent_id.clone(),
            exited: self.exited.clone(),
        };
        let nodes = self
            .config
            .nodes
            .iter()
            .map(|n| n.node_id.clone())
            .collect();
        let mut workers = Workers::new(executor, nodes);
        // GPU health from NVML: a real machine is one node.
        let health = shutdown.child_token();
        if self.config.executor == ExecutorKind::Real && self.config.nodes.len() == 1 {
            spawn_nvml(
                self.signals.clone(),
                self.config.health_poll_interval,
                health.clone(),
            );
        }

        self.sync_loop(&mut workers, &shutdown).await;
        health.cancel();

        tracing::info!("shutting down");
        workers.shutdown(SHUTDOWN_DEADLINE).await;
        tracing::info!("agent stopped");
    }

    /// Returns when `shutdown` is cancelled.
    async fn sync_loop(&mut self, workers: &mut Workers, shutdown: &CancellationToken) {
        let Some(mut interval) = self.register(shutdown).await else {
            return;
        };
        loop {
            workers.collect_exits().await;
            let signals = self.signals.pending();
            let req = SyncRequest {
                boot_id: self.boot_id,
                workers: workers.reports(),
                nodes: self
                    .config
                    .nodes
                    .iter()
                    .map(|n| NodeReport {
                        node_id: n.node_id.clone(),
                        boot_id: self.machine_boot.clone(),
                        signals: if self.config.nodes.len() == 1 {
                            signals.clone()
                        } else {
                            Vec::new()
                        },
                    })
                    .collect(),
            };
            let answer = tokio::select! {
                answer = self.region.sync(&self.config.agent_id, &req) => answer,
                _ = shutdown.cancelled() => return,
            };
            match answer {
                Ok(resp) => {
                    self.backoff.reset();
                    self.signals.accepted(signals.len());
                    workers.reconcile(&resp.assignments);
                    // Sync early when a worker exits, so the region hears
                    // of it within one round trip rather than one interval.
                    tokio::select! {
                        _ = sleep(interval) => {}
                        _ = self.exited.notified() => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
                Err(e) if must_reregister(&e) => {
                    tracing::warn!(error = %e, "region does not know this agent or boot: registering again");
                    match self.register(shutdown).await {
                        Some(i) => interval = i,
                        None => return,
                    }
                }
                Err(e) => {
                    let delay = self.backoff.next_delay();
                    if is_transient(&e) {
                        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "sync failed; workers keep running");
                    } else {
                        tracing::error!(error = %e, retry_in_ms = delay.as_millis() as u64, "region rejected sync; workers keep running");
                    }
                    tokio::select! {
                        _ = sleep(delay) => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Registers, retrying until the region accepts; returns the sync
    /// interval, or `None` when shut down first.
    async fn register(&mut self, shutdown: &CancellationToken) -> Option<Duration> {
        let req = RegisterRequest {
            agent_id: self.config.agent_id.clone(),
            boot_id: self.boot_id,
            executor: self.config.executor.as_str().to_string(),
            nodes: self.config.nodes.clone(),
        };
        loop {
            let answer = tokio::select! {
                answer = self.region.register(&req) => answer,
                _ = shutdown.cancelled() => return None,
            };
            let delay = match answer {
                Ok(resp) => {
                    self.backoff.reset();
                    let interval = match resp.sync_interval_ms {
                        0 => self.config.default_sync_interval,
                        ms => Duration::from_millis(ms),
                    };
                    tracing::info!(
                        region = %resp.region,
                        nodes = req.nodes.len(),
                        sync_interval_ms = interval.as_millis() as u64,
                        "registered"
                    );
                    return Some(interval);
                }
                Err(e) => {
                    let delay = self.backoff.next_delay();
                    if is_transient(&e) {
                        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot register yet");
                    } else {
                        // Keep trying: the region's operator may fix what it
                        // objects to, and exiting would help no one.
                        tracing::error!(error = %e, retry_in_ms = delay.as_millis() as u64, "region rejected registration");
                    }
                    delay
                }
            };
            tokio::select! {
                _ = sleep(delay) => {}
                _ = shutdown.cancelled() => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests;
