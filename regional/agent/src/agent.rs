//! The agent's loop: register, then sync and reconcile until shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gangway_shared::agent::{NodeReport, RegisterRequest, SyncRequest};
use tokio::sync::Notify;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::checkpoints::Checkpoints;
use crate::config::{AgentConfig, ExecutorKind};
use crate::executor::isolation::Isolation;
use crate::executor::Executor;
use crate::health::{machine_boot_id, nvml_gpu_power_w, spawn_nvml, Signals};
use crate::logs::LogShipper;
use crate::region::{is_transient, must_reregister, Backoff, RegionClient, RegionLink};
use crate::workers::Workers;

/// How long shutdown waits for real workers to end after SIGTERM before it
/// kills what is left, whatever their grace periods.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

/// Runs the agent until `shutdown` is cancelled, then stops its workers and
/// returns. An unreachable or failing region is logged and retried, never
/// fatal: running workers carry on meanwhile.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().context("invalid agent configuration")?;
    let link = RegionLink::new(config.token.as_deref(), config.region_ca_pem.as_deref())
        .map_err(|e| anyhow::anyhow!("building the client for the region: {e}"))?;
    run_with_link(config, link, shutdown).await
}

/// [`run`] calling the region over `link` (built from the same token and
/// CA as `config`'s), whose holder may replace its client: `gangway agent`
/// does on SIGHUP, with a re-read token file and CA.
pub async fn run_with_link(
    config: AgentConfig,
    link: RegionLink,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.validate().context("invalid agent configuration")?;
    let boot_id = Uuid::new_v4();
    let span = tracing::info_span!(
        parent: None,
        "agent",
        agent_id = %config.agent_id,
        %boot_id,
        executor = %config.executor,
    );
    Agent::new(config, link, boot_id)?
        .run(shutdown)
        .instrument(span)
        .await;
    Ok(())
}

struct Agent {
    config: AgentConfig,
    boot_id: Uuid,
    /// Who claims the nodes: the same across restarts of this agent here.
    host_id: String,
    /// The machine's boot id, reported for every node.
    machine_boot: String,
    /// Health signals not yet accepted by the region (one node: the
    /// machine's; a multi-node simulated agent reports none).
    signals: Signals,
    region: RegionClient,
    exited: Arc<Notify>,
    backoff: Backoff,
    lease: Lease,
    /// Real executor: the checkpoint store and what waits to be reported.
    checkpoints: Option<Arc<Checkpoints>>,
    /// What real workers run as and may touch.
    isolation: Arc<Isolation>,
    /// Real executor: workers' output, shipped with the syncs.
    logs: Option<LogShipper>,
}

/// The agent's lease on its workers: renewed by every successful sync (and
/// registration); once it runs out the agent fences — asks its workers to
/// checkpoint and stops them — because the region will soon declare its
/// nodes lost and give their GPUs to others.
#[derive(Debug)]
struct Lease {
    /// The agent's own `fence_after`, if any.
    own: Option<Duration>,
    /// The shorter of the agent's and the region's.
    fence_after: Option<Duration>,
    /// A fenced worker's time to checkpoint.
    checkpoint: Duration,
    /// The last successful sync or registration.
    renewed: Instant,
    /// Fenced since the last successful sync.
    fenced: bool,
}

impl Lease {
    /// When the lease runs out (never, without one, or once fenced).
    fn expires(&self) -> Option<Instant> {
        match (self.fence_after, self.fenced) {
            (Some(d), false) => Some(self.renewed + d),
            _ => None,
        }
    }

    fn renew(&mut self) {
        if self.fenced {
            tracing::info!("synced with the region again: fence lifted");
        }
        self.renewed = Instant::now();
        self.fenced = false;
    }
}

/// Sleeps until `at`, or forever without one.
async fn until(at: Option<Instant>) {
    match at {
        Some(t) => sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl Agent {
    fn new(config: AgentConfig, link: RegionLink, boot_id: Uuid) -> anyhow::Result<Self> {
        let region = RegionClient::new(&config.region_url, link);
        let seed = boot_id.as_u64_pair().0;
        let machine_boot = machine_boot_id(
            config.machine_boot_id.as_deref(),
            config.executor == ExecutorKind::Real,
            &boot_id.to_string(),
        );
        let fence_after = config.fence_after;
        let (checkpoints, isolation) = match config.executor {
            ExecutorKind::Real => {
                let work_dir = std::path::absolute(&config.work_dir)
                    .context("resolving the work directory")?;
                let url = match &config.checkpoint_store {
                    Some(url) => url.clone(),
                    None => format!("file://{}", work_dir.join("checkpoint-store").display()),
                };
                // Before anything is written: it sets the agent's umask.
                let local_store = url.strip_prefix("file://").map(std::path::PathBuf::from);
                let isolation =
                    Isolation::resolve(&config.isolation, &work_dir, local_store.as_deref())
                        .context("cannot isolate workers (--isolation)")?;
                let store = gangway_checkpoint::CheckpointStore::open(&url)
                    .context("cannot open the checkpoint store (--checkpoint-store)")?;
                tracing::info!(url = %store.url(), "checkpoint store");
                (
                    Some(Arc::new(Checkpoints::new(store, &config.agent_id))),
                    isolation,
                )
            }
            ExecutorKind::Sim => (None, Isolation::off()),
        };
        Ok(Agent {
            logs: (config.executor == ExecutorKind::Real)
                .then(|| LogShipper::new(&config.work_dir)),
            checkpoints,
            isolation: Arc::new(isolation),
            host_id: crate::identity::host_id(&config.work_dir),
            config,
            boot_id,
            machine_boot,
            signals: Signals::default(),
            region,
            lease: Lease {
                own: fence_after,
                fence_after,
                checkpoint: Duration::from_secs(20),
                renewed: Instant::now(),
                fenced: false,
            },
            exited: Arc::new(Notify::new()),
            backoff: Backoff::new(seed),
        })
    }

    async fn run(mut self, shutdown: CancellationToken) {
        if self.config.executor == ExecutorKind::Real {
            // Before registering: the region takes this start as a new boot
            // and launches our assignments again.
            let dir = self.config.work_dir.clone();
            let _ = tokio::task::spawn_blocking(move || crate::executor::reap_orphans(&dir)).await;
        }
        let executor = Executor {
            kind: self.config.executor,
            time_factor: self.config.time_factor,
            work_dir: self.config.work_dir.clone(),
            agent_id: self.config.agent_id.clone(),
            exited: self.exited.clone(),
            checkpoints: self.checkpoints.clone(),
            isolation: self.isolation.clone(),
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
            // Its GPUs' enforced power limit is their draw, whatever the
            // fleet file says (the file's figure stays where NVML has none).
            if let Some(watts) = nvml_gpu_power_w() {
                self.config.nodes[0].gpu_power_w = Some(watts);
            }
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
        let Some(mut interval) = self.register(workers, shutdown).await else {
            return;
        };
        // Word that our assignments changed wakes the loop as an exit does.
        let watching = shutdown.child_token();
        tokio::spawn(watch_changes(
            self.region.clone(),
            self.config.agent_id.clone(),
            self.exited.clone(),
            watching.clone(),
        ));
        let _watching = watching.drop_guard();
        loop {
            workers.collect_exits().await;
            let signals = self.signals.pending();
            let uploaded = self.checkpoints.as_ref().map(|c| c.pending());
            let reports = workers.reports();
            // Output is followed for every worker; the region is told only
            // what it has not heard (a steady agent's sync carries no worker).
            let logs = (self.logs.as_mut()).map_or_else(Vec::new, |l| l.pending(&reports));
            let reports = workers.unheard(reports);
            let req = SyncRequest {
                logs,
                boot_id: self.boot_id,
                workers: reports,
                checkpoints: uploaded.clone(),
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
            let region = self.region.clone();
            let agent_id = self.config.agent_id.clone();
            metrics::gauge!("gangway_agent_workers").set(workers.running() as f64);
            let sent = Instant::now();
            let call = region.sync(&agent_id, &req);
            tokio::pin!(call);
            let answer = loop {
                tokio::select! {
                    answer = &mut call => break answer,
                    _ = until(self.lease.expires()) => self.fence(workers),
                    _ = shutdown.cancelled() => return,
                }
            };
            let took = sent.elapsed();
            metrics::histogram!("gangway_agent_sync_seconds").record(took.as_secs_f64());
            match answer {
                Ok(resp) => {
                    self.lease.renew();
                    self.backoff.reset();
                    self.signals.accepted(signals.len());
                    if let (Some(store), Some(sent)) = (&self.checkpoints, &uploaded) {
                        store.accepted(sent);
                    }
                    if let (Some(logs), true) = (self.logs.as_mut(), resp.logs_kept) {
                        logs.kept(&req.logs);
                    }
                    if !resp.report_again {
                        workers.delivered(&req.workers);
                    }
                    let news = workers.reconcile(&resp.assignments);
                    // Sync early when a worker exits or the region says our
                    // assignments changed (`watch_changes`), so each is
                    // heard within a round trip rather than an interval; at
                    // once when we launched workers, so the region hears
                    // they run — if it answered this sync quickly (a tenth
                    // of the interval): a slow answer means a busy region,
                    // which hears of them at the interval; and soon when
                    // the region left some of our reports for later (their
                    // job was busy), as its GPUs stay allocated until they
                    // are heard.
                    let wait = if news && took < interval / 10 {
                        Duration::ZERO
                    } else if resp.report_again {
                        soon(interval)
                    } else {
                        jittered(interval)
                    };
                    tokio::select! {
                        _ = sleep(wait) => {}
                        _ = self.exited.notified() => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
                Err(e) if must_reregister(&e) => {
                    metrics::counter!("gangway_agent_sync_failures_total", "kind" => "reregister")
                        .increment(1);
                    tracing::warn!(error = %e, "region does not know this agent or boot: registering again");
                    match self.register(workers, shutdown).await {
                        Some(i) => interval = i,
                        None => return,
                    }
                }
                Err(e) => {
                    let delay = self.backoff.next_delay();
                    let kind = if is_transient(&e) {
                        "transient"
                    } else {
                        "rejected"
                    };
                    metrics::counter!("gangway_agent_sync_failures_total", "kind" => kind)
                        .increment(1);
                    if is_transient(&e) {
                        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "sync failed; workers keep running");
                    } else {
                        tracing::error!(error = %e, retry_in_ms = delay.as_millis() as u64, "region rejected sync; workers keep running");
                    }
                    let wake = Instant::now() + delay;
                    loop {
                        tokio::select! {
                            _ = sleep_until(wake) => break,
                            _ = until(self.lease.expires()) => self.fence(workers),
                            _ = shutdown.cancelled() => return,
                        }
                    }
                }
            }
        }
    }

    /// The lease ran out: checkpoint and stop every running worker; start
    /// nothing until a sync succeeds (only a successful sync launches).
    fn fence(&mut self, workers: &mut Workers) {
        self.lease.fenced = true;
        let asked = workers.fence(self.lease.checkpoint);
        tracing::warn!(
            silent_ms = self.lease.renewed.elapsed().as_millis() as u64,
            workers = asked,
            checkpoint_s = self.lease.checkpoint.as_secs(),
            "no successful sync for the lease: fenced (workers checkpoint and stop; nothing starts until the region answers)"
        );
    }

    /// Registers, retrying until the region accepts (fencing when the lease
    /// runs out meanwhile); returns the sync interval, or `None` when shut
    /// down first.
    async fn register(
        &mut self,
        workers: &mut Workers,
        shutdown: &CancellationToken,
    ) -> Option<Duration> {
        let req = RegisterRequest {
            agent_id: self.config.agent_id.clone(),
            boot_id: self.boot_id,
            executor: self.config.executor.as_str().to_string(),
            nodes: self.config.nodes.clone(),
            host_id: Some(self.host_id.clone()),
        };
        loop {
            let region = self.region.clone();
            let call = region.register(&req);
            tokio::pin!(call);
            let answer = loop {
                tokio::select! {
                    answer = &mut call => break answer,
                    _ = until(self.lease.expires()) => self.fence(workers),
                    _ = shutdown.cancelled() => return None,
                }
            };
            let delay = match answer {
                Ok(resp) => {
                    self.backoff.reset();
                    // The region's lease, unless ours is shorter.
                    let region_lease = (resp.fence_after_ms > 0)
                        .then(|| Duration::from_millis(resp.fence_after_ms));
                    self.lease.fence_after = match (self.lease.own, region_lease) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    if resp.fence_checkpoint_s > 0 {
                        self.lease.checkpoint = Duration::from_secs(resp.fence_checkpoint_s);
                    }
                    self.lease.renew();
                    let interval = match resp.sync_interval_ms {
                        0 => self.config.default_sync_interval,
                        ms => Duration::from_millis(ms),
                    };
                    tracing::info!(
                        region = %resp.region,
                        nodes = req.nodes.len(),
                        sync_interval_ms = interval.as_millis() as u64,
                        fence_after_ms = self.lease.fence_after.map(|d| d.as_millis() as u64),
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
            let wake = Instant::now() + delay;
            loop {
                tokio::select! {
                    _ = sleep_until(wake) => break,
                    _ = until(self.lease.expires()) => self.fence(workers),
                    _ = shutdown.cancelled() => return None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

/// Long-polls the region for changes to this agent's assignments
/// (`RegionClient::changes`) until `stop`, waking `sync_now` on each. A
/// region without the endpoint is left alone (the agent syncs on its
/// interval, as before); any other failure is retried after a second, the
/// sync loop being the one that re-registers or backs off.
async fn watch_changes(
    region: RegionClient,
    agent_id: String,
    sync_now: Arc<Notify>,
    stop: CancellationToken,
) {
    loop {
        let answer = tokio::select! {
            a = region.changes(&agent_id, crate::region::CHANGES_WAIT) => a,
            _ = stop.cancelled() => return,
        };
        match answer {
            Ok(true) => sync_now.notify_one(),
            Ok(false) => {}
            Err(gangway_shared::client::ClientError::Unexpected { status, .. })
                if matches!(status.as_u16(), 404 | 405) =>
            {
                tracing::info!("the region pushes no assignment changes: syncing on the interval");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "waiting for assignment changes failed; again in a second");
                tokio::select! {
                    _ = sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }
}

/// `interval`, give or take a tenth at random: agents started together
/// (a rack powered on, a region restarted) do not keep syncing in step,
/// which would make a region's syncs, and the heartbeats they write,
/// arrive in bursts.
fn jittered(interval: Duration) -> Duration {
    let tenth = interval.as_micros() as u64 / 10;
    if tenth == 0 {
        return interval;
    }
    interval - Duration::from_micros(tenth) + Duration::from_micros(random_below(2 * tenth))
}

/// A short, random wait before reporting again what the region left for
/// later: between a fiftieth and a fifth of `interval`, so the agents of
/// one gang, which ended together and met on its job, come back apart.
fn soon(interval: Duration) -> Duration {
    let fiftieth = interval.as_micros() as u64 / 50;
    Duration::from_micros(fiftieth + random_below(9 * fiftieth))
}

/// A random number in `0..n` (0 when `n` is 0).
fn random_below(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() as u64)
        .checked_rem(n)
        .unwrap_or(0)
}
