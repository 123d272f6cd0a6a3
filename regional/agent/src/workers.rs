//! This boot's workers, reconciled against the region's assignments.
//!
//! Every worker ever launched in this boot stays in the table, keyed by
//! (job, rank, attempt), so no key is launched twice. An exit is reported on
//! every sync until the region stops listing the worker; then it is
//! *retired*: no longer reported, but remembered, so that a region that
//! lists it again (after a restore, say) hears the same exit instead of
//! getting a second run. A running worker is reported until the region has
//! heard it running ([`Workers::unheard`]), and again when its checkpoint
//! moves: a sync from an agent whose workers run on as recorded carries
//! none, and costs the region no read of them.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_shared::agent::{Assignment, Desired, WorkerReport, WorkerStatus};
use tokio::time::Instant;

use crate::executor::{Executor, Exit, WorkerHandle, WorkerKey};

#[derive(Debug)]
enum State {
    Running {
        handle: WorkerHandle,
        /// A stop has been requested; the worker is on its way out.
        stopping: bool,
        /// The agent stopped it itself: it lost the region for longer
        /// than its lease.
        fenced: bool,
        /// The region lists it started: it has recorded it running.
        started: bool,
        /// The checkpoint its last running report carried, once a sync
        /// delivered it ([`Workers::delivered`]).
        delivered: Option<Option<String>>,
    },
    Exited {
        exit: Exit,
        /// The region no longer lists it: not reported.
        retired: bool,
        /// Stopped by the agent's fence (reported as such).
        fenced: bool,
        /// It ended by itself: no stop or checkpoint had been passed on.
        unasked: bool,
    },
}

#[derive(Debug)]
pub(crate) struct Workers {
    executor: Executor,
    /// The nodes this agent serves; assignments for others are ignored.
    nodes: Vec<String>,
    table: BTreeMap<WorkerKey, State>,
}

impl Workers {
    pub fn new(executor: Executor, nodes: Vec<String>) -> Self {
        Workers {
            executor,
            nodes,
            table: BTreeMap::new(),
        }
    }

    /// Moves workers whose task has ended from running to exited.
    pub async fn collect_exits(&mut self) {
        for state in self.table.values_mut() {
            let State::Running {
                handle,
                fenced,
                stopping,
                ..
            } = state
            else {
                continue;
            };
            let (fenced, unasked) = (*fenced, !*stopping);
            if !handle.task.is_finished() {
                continue;
            }
            // Finished, so this does not wait.
            let exit = match (&mut handle.task).await {
                Ok(exit) => exit,
                Err(e) => Exit {
                    exit_code: None,
                    signal: None,
                    message: Some(format!("agent lost the worker: {e}")),
                    checkpoint: None,
                },
            };
            *state = State::Exited {
                exit,
                retired: false,
                fenced,
                unasked,
            };
        }
    }

    /// The agent lost the region for longer than its lease: every running
    /// worker not already on its way out is asked to checkpoint within
    /// `deadline` and then stopped (the same path as a region's
    /// `Checkpoint`), and its exit is reported as fenced. Returns how many
    /// were asked.
    pub fn fence(&mut self, deadline: Duration) -> usize {
        let mut asked = 0;
        for (key, state) in &mut self.table {
            if let State::Running {
                handle,
                stopping: stopping @ false,
                fenced,
                ..
            } = state
            {
                if handle.task.is_finished() {
                    continue; // it ended on its own, before the fence
                }
                tracing::warn!(job_id = %key.job_id, worker = %key, "fenced: asking worker to checkpoint and stop");
                handle.control.checkpoint_within(Some(deadline));
                *stopping = true;
                *fenced = true;
                asked += 1;
            }
        }
        asked
    }

    /// Workers still running (fenced or not).
    pub fn running(&self) -> usize {
        self.table
            .values()
            .filter(|s| matches!(s, State::Running { .. }))
            .count()
    }

    /// What to tell the region: every running worker and every exit it has
    /// not yet acknowledged (by no longer listing the worker). A running
    /// real worker's report carries its job's newest complete checkpoint,
    /// so the region knows it before the worker exits.
    pub fn reports(&self) -> Vec<WorkerReport> {
        let mut newest: BTreeMap<uuid::Uuid, Option<String>> = BTreeMap::new();
        self.table
            .iter()
            .filter_map(|(key, state)| {
                let (status, checkpoint, fenced, unasked) = match state {
                    State::Running { .. } => (
                        WorkerStatus::Running,
                        newest
                            .entry(key.job_id)
                            .or_insert_with(|| self.executor.running_checkpoint(key.job_id))
                            .clone(),
                        false,
                        false,
                    ),
                    State::Exited { retired: true, .. } => return None,
                    State::Exited {
                        exit,
                        fenced,
                        unasked,
                        ..
                    } => (exit.status(), exit.checkpoint.clone(), *fenced, *unasked),
                };
                Some(WorkerReport {
                    job_id: key.job_id,
                    rank: key.rank,
                    attempt: key.attempt,
                    status,
                    checkpoint,
                    fenced,
                    unasked,
                })
            })
            .collect()
    }

    /// Of `reports` (from [`Workers::reports`]), those the region has not
    /// heard: every exit, and a running worker until the region lists it
    /// started after a sync delivered its report, or when its checkpoint
    /// is not the one delivered. What is left out changes nothing there
    /// (a running worker recorded running); sending it again would cost
    /// the region a read of each worker at each sync.
    pub fn unheard(&self, mut reports: Vec<WorkerReport>) -> Vec<WorkerReport> {
        reports.retain(|r| match self.table.get(&WorkerKey::reported(r)) {
            Some(State::Running {
                started: true,
                delivered: Some(checkpoint),
                ..
            }) if r.status == WorkerStatus::Running => *checkpoint != r.checkpoint,
            _ => true,
        });
        reports
    }

    /// A sync delivered `sent`, and the region kept every report of it
    /// (it asked for none again).
    pub fn delivered(&mut self, sent: &[WorkerReport]) {
        for r in sent.iter().filter(|r| r.status == WorkerStatus::Running) {
            let key = WorkerKey::reported(r);
            if let Some(State::Running { delivered, .. }) = self.table.get_mut(&key) {
                *delivered = Some(r.checkpoint.clone());
            }
        }
    }

    /// Acts on the difference between the region's full list of wanted
    /// workers and ours. Idempotent: the same list twice changes nothing.
    /// Returns whether it has news for the region at once: workers it
    /// launched (running now) or recorded as never started.
    #[must_use = "news is worth a sync now rather than at the next interval"]
    pub fn reconcile(&mut self, assignments: &[Assignment]) -> bool {
        let mut news = false;
        // A key listed twice is stopped if either listing says so.
        let mut wanted: BTreeMap<WorkerKey, &Assignment> = BTreeMap::new();
        for a in assignments {
            let entry = wanted.entry(WorkerKey::of(a)).or_insert(a);
            if a.desired == Desired::Stop {
                *entry = a;
            }
        }

        for (key, a) in &wanted {
            if let Some(State::Running { started, .. }) = self.table.get_mut(key) {
                *started = a.started;
            }
            match (a.desired, self.table.get_mut(key)) {
                (Desired::Run, None) => {
                    if !self.nodes.contains(&a.node_id) {
                        tracing::warn!(
                            job_id = %key.job_id,
                            node_id = %a.node_id,
                            "assignment for a node this agent does not serve: ignored"
                        );
                        continue;
                    }
                    let handle = self.executor.launch(self.executor.spec(a));
                    news = true;
                    self.table.insert(
                        *key,
                        State::Running {
                            handle,
                            stopping: false,
                            fenced: false,
                            started: false,
                            delivered: None,
                        },
                    );
                }
                (
                    Desired::Stop,
                    Some(State::Running {
                        handle, stopping, ..
                    }),
                ) => {
                    if !*stopping {
                        tracing::info!(job_id = %key.job_id, worker = %key, "region asks to stop worker");
                        handle.control.stop.cancel();
                        *stopping = true;
                    }
                }
                (_, Some(State::Exited { retired, .. })) => {
                    if *retired {
                        tracing::warn!(job_id = %key.job_id, worker = %key, "region lists a retired worker again: reporting its exit again");
                        *retired = false;
                    }
                }
                (
                    Desired::Checkpoint,
                    Some(State::Running {
                        handle, stopping, ..
                    }),
                ) => {
                    // One that has already ended by itself is left to be
                    // reported so (its exit is its work done).
                    if !*stopping && !handle.task.is_finished() {
                        tracing::info!(job_id = %key.job_id, worker = %key, deadline_s = a.checkpoint_deadline_s, "region asks worker to checkpoint and stop");
                        // The deadline given now (a drain's may be shorter
                        // than the one at launch).
                        handle.control.checkpoint_within(
                            (a.checkpoint_deadline_s > 0)
                                .then(|| Duration::from_secs(a.checkpoint_deadline_s)),
                        );
                        *stopping = true;
                    }
                }
                (Desired::Stop | Desired::Checkpoint, None) => {
                    // Never launched in this boot (the region placed it and
                    // changed its mind before we started it, or we restarted):
                    // report it ended, so the region can free its GPUs.
                    if self.nodes.contains(&a.node_id) {
                        news = true;
                        self.table.insert(
                            *key,
                            State::Exited {
                                exit: Exit {
                                    exit_code: None,
                                    signal: None,
                                    message: Some("stopped before it started".into()),
                                    checkpoint: None,
                                },
                                retired: false,
                                fenced: false,
                                unasked: false,
                            },
                        );
                    }
                }
                (Desired::Run, Some(State::Running { .. })) => {}
            }
        }

        for (key, state) in &mut self.table {
            if wanted.contains_key(key) {
                continue;
            }
            match state {
                State::Running {
                    handle, stopping, ..
                } => {
                    if !*stopping {
                        tracing::info!(job_id = %key.job_id, worker = %key, "region no longer lists worker: stopping it");
                        handle.control.stop.cancel();
                        *stopping = true;
                    }
                }
                State::Exited { retired, .. } => *retired = true,
            }
        }
        news
    }

    /// Stops every running worker: SIGTERM, SIGKILL after its grace period,
    /// and SIGKILL for all that remain once `deadline` has passed.
    pub async fn shutdown(mut self, deadline: Duration) {
        let mut running: Vec<(WorkerKey, WorkerHandle)> = Vec::new();
        for (key, state) in std::mem::take(&mut self.table) {
            if let State::Running { handle, .. } = state {
                handle.control.stop.cancel();
                running.push((key, handle));
            }
        }
        if running.is_empty() {
            return;
        }
        tracing::info!(workers = running.len(), "stopping workers");
        let until = Instant::now() + deadline;
        for (_, handle) in &mut running {
            let _ = tokio::time::timeout_at(until, &mut handle.task).await;
        }
        let left: Vec<_> = running
            .into_iter()
            .filter(|(_, handle)| !handle.task.is_finished())
            .collect();
        if left.is_empty() {
            return;
        }
        tracing::warn!(
            workers = left.len(),
            "workers outlived the shutdown deadline: killing them"
        );
        let until = Instant::now() + Duration::from_secs(2);
        for (key, mut handle) in left {
            handle.control.kill.cancel();
            if tokio::time::timeout_at(until, &mut handle.task)
                .await
                .is_err()
            {
                tracing::error!(job_id = %key.job_id, worker = %key, "worker did not end after SIGKILL");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gangway_shared::agent::Assignment;
    use tokio::sync::Notify;
    use uuid::Uuid;

    use super::*;
    use crate::config::ExecutorKind;

    fn sim_workers() -> Workers {
        let executor = Executor {
            kind: ExecutorKind::Sim,
            time_factor: 1.0,
            work_dir: std::env::temp_dir(),
            agent_id: "agent-test".into(),
            exited: Arc::new(Notify::new()),
            checkpoints: None,
            isolation: Arc::new(crate::executor::isolation::Isolation::off()),
        };
        Workers::new(executor, vec!["node-a".into()])
    }

    fn assignment(job_id: Uuid, desired: Desired, estimated_s: i64) -> Assignment {
        Assignment {
            job_id,
            tenant: "acme".into(),
            rank: 0,
            attempt: 0,
            desired,
            node_id: "node-a".into(),
            gpus: vec![0, 1],
            world_size: 1,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            command: vec!["train".into()],
            env: Default::default(),
            estimated_duration_s: estimated_s,
            max_duration_s: None,
            grace_period_s: 30,
            checkpoint_deadline_s: 5,
            restore_from: None,
            epoch: 1,
            started: false,
        }
    }

    fn statuses(workers: &Workers) -> Vec<(Uuid, WorkerStatus)> {
        workers
            .reports()
            .into_iter()
            .map(|r| (r.job_id, r.status))
            .collect()
    }

    async fn settle() {
        // Lets worker tasks observe a cancellation.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn finished() -> WorkerStatus {
        WorkerStatus::Exited {
            exit_code: Some(0),
            signal: None,
            message: Some("simulated run finished".into()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn runs_once_reports_the_exit_until_unlisted_and_never_relaunches() {
        let mut w = sim_workers();
        let job = Uuid::new_v4();
        let run = vec![assignment(job, Desired::Run, 10)];

        assert!(w.reconcile(&run), "a launch is news for the region");
        assert!(!w.reconcile(&run), "the same list again is not");
        assert_eq!(statuses(&w), vec![(job, WorkerStatus::Running)]);

        tokio::time::sleep(Duration::from_secs(10)).await;
        settle().await;
        w.collect_exits().await;
        assert_eq!(statuses(&w), vec![(job, finished())]);

        // Still listed: the exit is reported again, and nothing relaunches.
        let _ = w.reconcile(&run);
        w.collect_exits().await;
        assert_eq!(statuses(&w), vec![(job, finished())]);

        // Unlisted: forgotten.
        let _ = w.reconcile(&[]);
        assert_eq!(statuses(&w), vec![]);

        // Listed again by mistake: the same exit, not a second run.
        let _ = w.reconcile(&run);
        assert_eq!(statuses(&w), vec![(job, finished())]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_worker_is_reported_until_the_region_has_heard_it_and_its_exit_always() {
        let mut w = sim_workers();
        let job = Uuid::new_v4();
        let mut run = vec![assignment(job, Desired::Run, 10)];
        let _ = w.reconcile(&run);
        let unheard = |w: &Workers| -> Vec<(Uuid, WorkerStatus)> {
            (w.unheard(w.reports()).into_iter())
                .map(|r| (r.job_id, r.status))
                .collect()
        };
        assert_eq!(unheard(&w), vec![(job, WorkerStatus::Running)]);

        // Listed started before any sync delivered the report (it timed
        // out after the region recorded it): still reported.
        run[0].started = true;
        let _ = w.reconcile(&run);
        assert_eq!(unheard(&w), vec![(job, WorkerStatus::Running)]);

        // Delivered, and listed started: nothing to tell.
        w.delivered(&w.reports());
        let _ = w.reconcile(&run);
        assert_eq!(unheard(&w), vec![]);

        // A newer checkpoint than the one delivered is news.
        let mut moved = w.reports();
        moved[0].checkpoint = Some("sim:step-40".into());
        assert_eq!(w.unheard(moved.clone()).len(), 1);
        w.delivered(&moved);
        assert_eq!(w.unheard(moved).len(), 0);

        // A region that lists it not started (restored from a backup, say)
        // hears it again.
        run[0].started = false;
        let _ = w.reconcile(&run);
        assert_eq!(unheard(&w), vec![(job, WorkerStatus::Running)]);

        // An exit is reported until unlisted, started or not.
        run[0].started = true;
        let _ = w.reconcile(&run);
        tokio::time::sleep(Duration::from_secs(10)).await;
        settle().await;
        w.collect_exits().await;
        w.delivered(&w.reports());
        assert_eq!(unheard(&w), vec![(job, finished())]);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_workers_the_region_stops_or_no_longer_lists() {
        let mut w = sim_workers();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let _ = w.reconcile(&[
            assignment(a, Desired::Run, 1000),
            assignment(b, Desired::Run, 1000),
        ]);
        let _ = w.reconcile(&[assignment(a, Desired::Stop, 1000)]);
        settle().await;
        w.collect_exits().await;
        let stopped = WorkerStatus::Exited {
            exit_code: None,
            signal: Some(15),
            message: Some("stopped".into()),
        };
        let mut got = statuses(&w);
        got.sort_by_key(|(id, _)| *id);
        let mut want = vec![(a, stopped.clone()), (b, stopped)];
        want.sort_by_key(|(id, _)| *id);
        assert_eq!(got, want);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_for_an_unknown_worker_is_reported_ended_and_a_foreign_node_launches_nothing() {
        let mut w = sim_workers();
        let mut foreign = assignment(Uuid::new_v4(), Desired::Run, 10);
        foreign.node_id = "node-z".into();
        let never_started = Uuid::new_v4();
        let _ = w.reconcile(&[assignment(never_started, Desired::Stop, 10), foreign]);
        let got = statuses(&w);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, never_started);
        assert!(matches!(
            got[0].1,
            WorkerStatus::Exited {
                exit_code: None,
                ..
            }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_checkpoints_and_stops_every_running_worker_and_reports_it_fenced() {
        let mut w = sim_workers();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let _ = w.reconcile(&[
            assignment(a, Desired::Run, 1000),
            assignment(b, Desired::Run, 1000),
        ]);
        assert_eq!(w.fence(Duration::from_secs(1)), 2);
        assert_eq!(w.fence(Duration::from_secs(1)), 0, "asked once");
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        w.collect_exits().await;
        assert_eq!(w.running(), 0);
        let reports = w.reports();
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().all(|r| r.fenced
            && matches!(r.status, WorkerStatus::Exited { .. })
            && r.checkpoint.is_some()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_ended_before_the_fence_is_not_reported_fenced() {
        let mut w = sim_workers();
        let (done, going) = (Uuid::new_v4(), Uuid::new_v4());
        let _ = w.reconcile(&[
            assignment(done, Desired::Run, 1),
            assignment(going, Desired::Run, 1000),
        ]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        settle().await;
        // Its exit not collected yet when the agent fences.
        assert_eq!(w.fence(Duration::from_secs(1)), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        w.collect_exits().await;
        let reports = w.reports();
        let of = |id| reports.iter().find(|r| r.job_id == id).unwrap();
        assert!(!of(done).fenced, "{:?}", of(done));
        assert!(matches!(
            of(done).status,
            WorkerStatus::Exited {
                exit_code: Some(0),
                ..
            }
        ));
        assert!(of(going).fenced);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_ended_before_a_checkpoint_request_is_reported_unasked() {
        let mut w = sim_workers();
        let (done, going) = (Uuid::new_v4(), Uuid::new_v4());
        let _ = w.reconcile(&[
            assignment(done, Desired::Run, 1),
            assignment(going, Desired::Run, 1000),
        ]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        settle().await;
        // The region asks both to checkpoint (a fence, a preemption) while
        // `done`'s exit is not yet collected: the request crossed its exit.
        let _ = w.reconcile(&[
            assignment(done, Desired::Checkpoint, 1),
            assignment(going, Desired::Checkpoint, 1000),
        ]);
        settle().await;
        w.collect_exits().await;
        let reports = w.reports();
        let of = |id| reports.iter().find(|r| r.job_id == id).unwrap();
        assert!(of(done).unasked, "{:?}", of(done));
        assert_eq!(of(done).status, finished());
        assert!(!of(going).unasked, "stopped as asked: {:?}", of(going));
        assert!(matches!(of(going).status, WorkerStatus::Exited { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_sim_workers() {
        let mut w = sim_workers();
        let _ = w.reconcile(&[assignment(Uuid::new_v4(), Desired::Run, 1000)]);
        let started = Instant::now();
        w.shutdown(Duration::from_secs(10)).await;
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
