//! Failure drills against a local cloud (`gangway chaos <drill>`,
//! docs/failover.md): each starts its own cloud of three regions
//! ([`cloud::Cloud`]), or uses the one a running `gangway dev up` holds
//! ([`On::Dev`]: its parts broken and mended through its control API,
//! [`control`]), whose agents run the example trainer as real
//! processes, runs keyed trainer jobs, breaks something, and checks the
//! invariants afterwards — no acknowledged job lost; no job running in two
//! regions at once (every region's own copy sampled every 100 ms, and the
//! trainers' own logs: no two runs of a job ever stepped at the same
//! time); no GPU allocated twice in any region; every job ending with its
//! full step count — and reports how long recovery took and how much work
//! each job lost, split into the checkpoint interval's share and the
//! share not yet replicated.
//!
//! - `region-kill`: a whole region (control plane, PostgreSQL, agent and
//!   its workers) is killed; its jobs must run again in another region at
//!   the next epoch, and a retried create must return the adopted job;
//!   brought back (its machines freshly booted), the region must release
//!   its copies and start none of them.
//! - `agent-kill`: a region's agent is killed while it uploads a
//!   checkpoint (large ones, so that the upload takes a while) and started
//!   again; the half-uploaded checkpoint must never become the job's, the
//!   workers the dead agent left must be gone before the job runs again,
//!   and it must resume from its last whole checkpoint.
//! - `global-kill`: one of the global tier's two replicas is killed in
//!   the middle of a burst of keyed creates; the client retries what it
//!   was not answered at the other with the same keys; every acknowledged
//!   job must exist exactly once and succeed.
//! - `control-plane-kill`: only the region's control plane is killed; its
//!   agent fences and stops the workers, the buddy adopts; restarted, the
//!   region must release its copy.
//! - `database-kill`: only the region's PostgreSQL is killed; the region
//!   fences, its agent stops the workers, the buddy adopts; restarted, the
//!   region must release its copy.
//! - `partition`: a region is cut off from its peers and the global tier
//!   (its agent still reaches it); it must fence and stop its job, its
//!   buddy must adopt it, and once healed the home must release its copy.
//! - `database-failover` ([`db_failover`]): the region's database is a
//!   Patroni cluster; its primary's PostgreSQL is killed, then its
//!   primary's whole member, under load; nothing may fence, move, restart
//!   or be lost, and refusals meanwhile are 503s with Retry-After.
//!
//! [`browser`] drives a headless Chromium for the web console's tests.
//!
//! `region-kill` and `partition` also run on a lab of machines ([`lab`],
//! [`On::Lab`]), where the faults come from the network and the hosts
//! rather than from a proxy inside Gangway: the region's every host (its
//! router, database, both control-plane replicas and four GPU machines)
//! loses power — links down, SIGKILL to every process, workers included —
//! and boots again on its data; or its router leaves the WAN (`ip link set
//! wan0 down`) and comes back. The same checks judge both.

pub mod browser;
pub mod cloud;
pub mod control;
pub mod db_failover;
pub mod lab;
pub mod procs;
pub mod supervisor;
pub mod trainer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_shared::api::{Job, JobState};
use serde::Serialize;
use uuid::Uuid;

use cloud::{trainer_spec, Cloud, Executor, Training};

/// A drill's name as `gangway chaos` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drill {
    RegionKill,
    AgentKill,
    GlobalKill,
    ControlPlaneKill,
    DatabaseKill,
    Partition,
    DatabaseFailover,
}

impl Drill {
    pub const ALL: [Drill; 7] = [
        Drill::RegionKill,
        Drill::AgentKill,
        Drill::GlobalKill,
        Drill::ControlPlaneKill,
        Drill::DatabaseKill,
        Drill::Partition,
        Drill::DatabaseFailover,
    ];

    /// The drills that also run on a lab of machines ([`On::Lab`]).
    pub const ON_LAB: [Drill; 3] = [Drill::RegionKill, Drill::Partition, Drill::DatabaseFailover];

    pub fn as_str(self) -> &'static str {
        match self {
            Drill::RegionKill => "region-kill",
            Drill::AgentKill => "agent-kill",
            Drill::GlobalKill => "global-kill",
            Drill::ControlPlaneKill => "control-plane-kill",
            Drill::DatabaseKill => "database-kill",
            Drill::Partition => "partition",
            Drill::DatabaseFailover => "database-failover",
        }
    }
}

impl std::str::FromStr for Drill {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Drill::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Drill::ALL.iter().map(|d| d.as_str()).collect();
                format!("unknown drill {s:?}: one of {}", names.join(", "))
            })
    }
}

/// One job of a drill's workload, as it ended up.
#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    pub id: Uuid,
    /// Where it ran before the failure, and where at the end.
    pub home: String,
    pub region: String,
    pub epoch: i32,
    pub state: String,
    /// Seconds from the failure until it ran again elsewhere (its home's
    /// jobs only).
    pub recovered_s: Option<f64>,
    /// The work the failure cost it (the broken region's jobs only).
    pub lost: Option<trainer::Lost>,
    /// [`Self::lost`] in seconds of training.
    pub lost_s: Option<f64>,
    /// The step its last run ended at (the trainer's `final step`).
    pub final_step: Option<u32>,
}

/// What a drill found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub drill: String,
    /// The region broken.
    pub region: String,
    /// How every job trained.
    pub training: Training,
    pub jobs: Vec<JobReport>,
    /// Every broken invariant, in words; empty when the drill passed.
    pub violations: Vec<String>,
    /// What happened, in a few lines, beyond the table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Where the processes' logs are (kept only when the drill failed).
    pub logs: String,
    /// Whether it ran on a lab of machines ([`On::Lab`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lab: bool,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// What CI asks of a failover drill (region-kill, control-plane-kill,
    /// database-kill, partition; on loopback or on the lab) beyond its
    /// invariants: the broken region had jobs, and each of them ran again
    /// elsewhere at epoch 2 within `within_s` of the failure, succeeded
    /// there with its full step count, and resumed from a checkpoint (it
    /// failed past its second: not from scratch). Each shortfall, in words;
    /// empty when there is none.
    pub fn moved_and_resumed(&self, within_s: f64) -> Vec<String> {
        let t = &self.training;
        let mut v = Vec::new();
        let moved: Vec<&JobReport> = (self.jobs.iter())
            .filter(|j| j.home == self.region)
            .collect();
        if moved.is_empty() {
            v.push(format!("no job of {} in the report", self.region));
        }
        for j in moved {
            let id = j.id;
            if j.epoch != 2 {
                v.push(format!("job {id} at epoch {}, not 2", j.epoch));
            }
            if j.region == self.region {
                v.push(format!("job {id} still in {}", j.region));
            }
            if j.state != "succeeded" {
                v.push(format!("job {id} {}, not succeeded", j.state));
            }
            if j.final_step != Some(t.total) {
                v.push(format!(
                    "job {id} ended at step {:?}, not {}",
                    j.final_step, t.total
                ));
            }
            if !j.recovered_s.is_some_and(|s| s < within_s) {
                v.push(format!(
                    "job {id} ran elsewhere {:?} s after the failure, not within {within_s} s",
                    j.recovered_s
                ));
            }
            match j.lost {
                Some(l) if l.resumed >= t.every => {}
                Some(l) => v.push(format!(
                    "job {id} resumed from step {}, not from a checkpoint (every {})",
                    l.resumed, t.every
                )),
                None => v.push(format!("job {id}: no lost work measured")),
            }
        }
        v
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.training;
        writeln!(
            f,
            "drill {} on region {}{}: trainer jobs of {} steps × {} s, a checkpoint every {} steps ({:.1} s)",
            self.drill,
            self.region,
            if self.lab { " of the lab of machines" } else { "" },
            t.total,
            t.step_s,
            t.every,
            f64::from(t.every) * t.step_s
        )?;
        writeln!(
            f,
            "{:<36} {:<10} {:<10} {:>5} {:<9} {:>9} {:>22} {:>5}",
            "JOB", "HOME", "NOW", "EPOCH", "STATE", "RECOVERED", "LOST (CKPT+UNREPL)", "FINAL"
        )?;
        for j in &self.jobs {
            let lost = match (j.lost, j.lost_s) {
                (Some(l), Some(s)) => {
                    format!("{s:.1} s ({}+{} steps)", l.since_checkpoint, l.unreplicated)
                }
                _ => "-".into(),
            };
            writeln!(
                f,
                "{:<36} {:<10} {:<10} {:>5} {:<9} {:>9} {:>22} {:>5}",
                j.id,
                j.home,
                j.region,
                j.epoch,
                j.state,
                j.recovered_s.map_or("-".into(), |s| format!("{s:.1} s")),
                lost,
                j.final_step.map_or("-".into(), |s| s.to_string()),
            )?;
        }
        for n in &self.notes {
            writeln!(f, "{n}")?;
        }
        if self.passed() {
            write!(f, "passed: every invariant held")
        } else {
            writeln!(f, "FAILED:")?;
            for v in &self.violations {
                writeln!(f, "  - {v}")?;
            }
            write!(f, "logs in {}", self.logs)
        }
    }
}

/// Samples every region's own copy of `jobs` every 100 ms until stopped,
/// and returns each moment one ran in two regions at once. A fenced
/// region's copies do not count: what its database says of them is stale
/// until it has learned which moved (and the trainers' logs are checked
/// for that time).
fn watch_twice(
    cloud: Arc<Cloud>,
    jobs: Vec<Uuid>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut twice = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            // Per region, once a sample: whether it said it was unfenced
            // before and after its copies were read. The regions side by
            // side, so that one that answers slowly (a lab region without
            // power answers nothing) holds up no other's sample.
            let samples = cloud.names().into_iter().map(|r| {
                let (cloud, jobs) = (&cloud, &jobs);
                async move {
                    let mut seen = Vec::new();
                    if cloud.fenced(r).await != Some(false) {
                        return seen;
                    }
                    for id in jobs {
                        let copy = cloud.copy_in(r, *id).await;
                        if copy.is_some_and(|j| {
                            matches!(j.state, JobState::Starting | JobState::Running)
                        }) {
                            seen.push((*id, r));
                        }
                    }
                    if cloud.fenced(r).await != Some(false) {
                        seen.clear();
                    }
                    seen
                }
            });
            let running: Vec<(Uuid, &str)> = (futures_util::future::join_all(samples).await)
                .into_iter()
                .flatten()
                .collect();
            for id in &jobs {
                let live: Vec<&str> = (running.iter())
                    .filter(|(j, _)| j == id)
                    .map(|(_, r)| *r)
                    .collect();
                if live.len() > 1 {
                    twice.push(format!("job {id} running in {live:?} at once"));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        twice
    })
}

/// The workload's training: 30 s of steps, a checkpoint every 2 s.
pub const TRAINING: Training = Training {
    step_s: 0.1,
    every: 20,
    total: 300,
    checkpoint_mb: 0,
};

/// A job of the workload.
struct Work {
    key: String,
    id: Uuid,
    home: String,
    log: PathBuf,
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until the trainer logging to `log` has finished `step` steps.
async fn until_step(log: &Path, step: u32, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let l = trainer::Log::parse(&read_log(log));
        if l.runs.last().is_some_and(|r| r.reached >= step) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("{} never reached step {step}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where a drill runs.
#[derive(Clone, Copy, Debug)]
pub enum On<'a> {
    /// A cloud of its own, of `bin` (the `gangway` binary), with CI's
    /// short timers (`short`) or the defaults.
    Own { bin: &'a Path, short: bool },
    /// The running `gangway dev up` whose state dir this is.
    Dev(&'a Path),
    /// A lab of machines of its own ([`lab`]), of `bin`, with CI's short
    /// timers: [`Drill::ON_LAB`] only. Needs root.
    Lab { bin: &'a Path },
}

/// Runs `drill` on a cloud of its own of `bin` (short timers with `short`).
pub async fn run(drill: Drill, bin: &Path, short: bool) -> anyhow::Result<Report> {
    run_on(drill, On::Own { bin, short }).await
}

/// Runs `drill` on the cloud `on` says. A dev cloud is left as it was
/// found: whatever the drill broke is mended, however it ended.
pub async fn run_on(drill: Drill, on: On<'_>) -> anyhow::Result<Report> {
    let cloud = Arc::new(match on {
        // Its own cloud's first region on a Patroni cluster (always with
        // HA_TIMERS: short timers would fence during the failover).
        On::Own { bin, .. } if drill == Drill::DatabaseFailover => {
            Cloud::start_ha(bin, cloud::REGIONS[0]).await
        }
        On::Own { bin, short } => Cloud::start_with(bin, short, Executor::Real).await,
        On::Dev(_) if drill == Drill::DatabaseFailover => anyhow::bail!(
            "the database-failover drill runs on a cloud of its own (a region on a Patroni \
             cluster): run it without --dev"
        ),
        On::Dev(state_dir) => Cloud::attach(state_dir).await?,
        On::Lab { bin } => {
            if !Drill::ON_LAB.contains(&drill) {
                let names: Vec<&str> = Drill::ON_LAB.iter().map(|d| d.as_str()).collect();
                anyhow::bail!(
                    "the {} drill does not run on the lab of machines (yet): {} do",
                    drill.as_str(),
                    names.join(" and ")
                );
            }
            if drill == Drill::DatabaseFailover {
                // The first region's database a Patroni cluster on hosts
                // of its own: its primary's host loses power.
                Cloud::start_lab_ha(bin, lab::REGIONS[0]).await?
            } else {
                Cloud::start_lab(bin).await?
            }
        }
    });
    // Names and keys no earlier drill on the same cloud used.
    let tag = Uuid::new_v4().simple().to_string()[..8].to_string();
    let outcome = match drill {
        Drill::AgentKill => agent_kill(cloud.clone(), &tag).await,
        Drill::GlobalKill => global_kill(cloud.clone(), &tag).await,
        Drill::DatabaseFailover => db_failover::run(cloud.clone(), &tag).await,
        _ => failover(drill, cloud.clone(), &tag).await,
    };
    if !cloud.is_dev() {
        return outcome;
    }
    match (cloud.mend_all().await, outcome) {
        (Ok(()), outcome) => outcome,
        (Err(e), Ok(mut report)) => {
            report.violations.push(format!(
                "the dev cloud was not mended after the drill: {e:#}"
            ));
            Ok(report)
        }
        (Err(e), Err(drill)) => {
            Err(drill.context(format!("and the dev cloud was not mended: {e:#}")))
        }
    }
}

/// The drills that break a region and watch its jobs move: region-kill,
/// control-plane-kill, database-kill and partition.
async fn failover(drill: Drill, cloud: Arc<Cloud>, tag: &str) -> anyhow::Result<Report> {
    let t = TRAINING;
    let n = match drill {
        Drill::RegionKill => 2,
        _ => 1,
    };
    // The workload: keyed trainer jobs, every one past its second
    // checkpoint before the failure.
    let mut jobs = Vec::new();
    for i in 0..n {
        let key = format!("drill-{tag}-{i}");
        let log = cloud.shared().join(format!("trainer-{key}.log"));
        let spec = trainer_spec(&cloud.trainer(), &key, t, &log);
        let job = cloud.tenant.submit(&spec, Some(&key)).await?;
        jobs.push(Work {
            key,
            id: job.id,
            home: job.region.clone(),
            log,
        });
    }
    for w in &jobs {
        let within = Duration::from_secs(60);
        (cloud.wait_for(w.id, "running", within, |j| j.state == JobState::Running)).await?;
        until_step(&w.log, 2 * t.every + t.every / 2, within).await?;
    }
    let victim = jobs[0].home.clone();
    let ids: Vec<Uuid> = jobs.iter().map(|w| w.id).collect();
    let mut violations = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    let watch = watch_twice(cloud.clone(), ids.clone(), stop.clone());
    // Where each trainer's log stood at the failure.
    let at: Vec<usize> = jobs.iter().map(|w| read_log(&w.log).len()).collect();
    let broke = Instant::now();
    let broke_at = chrono::Utc::now();
    // What the lab's faults took (the loopback's are instant).
    let mut notes = Vec::new();
    if let Some(lab) = cloud.lab() {
        match drill {
            Drill::RegionKill => notes.push(format!(
                "{victim} lost power host by host: {} (links down, then SIGKILL to every process)",
                lab.region_hosts(&victim).join(", ")
            )),
            Drill::Partition => notes.push(format!(
                "{victim}'s router left the WAN (wan0 down); its hosts reach each other, nothing else"
            )),
            _ => {}
        }
    }
    match drill {
        Drill::RegionKill => cloud.kill(&victim).await?,
        Drill::AgentKill | Drill::GlobalKill | Drill::DatabaseFailover => {
            unreachable!("drills of their own")
        }
        Drill::ControlPlaneKill => cloud.kill_control(&victim).await?,
        Drill::DatabaseKill => cloud.kill_database(&victim).await?,
        Drill::Partition => cloud.partition(&victim, true).await?,
    }
    if let Some(n) = notes.first_mut() {
        n.push_str(&format!(", in {:.2} s", broke.elapsed().as_secs_f64()));
    }
    // Each of the victim's jobs runs again elsewhere at the next epoch.
    let mut recovered = BTreeMap::new();
    for w in jobs.iter().filter(|w| w.home == victim) {
        let moved = cloud
            .wait_for(w.id, "running elsewhere", Duration::from_secs(90), |j| {
                j.state == JobState::Running && j.region != w.home
            })
            .await;
        match moved {
            Ok(j) if j.epoch == 2 => {
                recovered.insert(w.id, broke.elapsed().as_secs_f64());
            }
            Ok(j) => violations.push(format!("job {} moved at epoch {}, not 2", w.id, j.epoch)),
            Err(e) => violations.push(e.to_string()),
        }
    }
    // The broken region comes back, and must release its copies of the
    // moved jobs (and, freshly booted, start none of them meanwhile).
    let back = match drill {
        Drill::AgentKill | Drill::GlobalKill | Drill::DatabaseFailover => false,
        Drill::RegionKill => {
            // Were it never to come back, its moved jobs would be billed
            // from its copies, to its death.
            let moved: Vec<Uuid> = (jobs.iter())
                .filter(|w| w.home == victim && recovered.contains_key(&w.id))
                .map(|w| w.id)
                .collect();
            violations.extend(billed_from_copies(&cloud, &victim, &moved, broke_at).await);
            let region = supervisor::Target::Region {
                region: victim.clone(),
            };
            if let Err(e) = cloud.apply(region, false).await {
                violations.push(format!("{victim} did not start again: {e:#}"));
            }
            true
        }
        Drill::Partition => {
            let copy = cloud.copy_in(&victim, ids[0]).await;
            if copy.is_some_and(|c| matches!(c.state, JobState::Starting | JobState::Running)) {
                violations.push(format!("the cut-off region {victim} still runs its job"));
            }
            if let Err(e) = cloud.partition(&victim, false).await {
                violations.push(format!("{victim}'s links were not healed: {e:#}"));
            }
            true
        }
        Drill::ControlPlaneKill => {
            if let Err(e) = cloud.restart_control(&victim).await {
                violations.push(format!(
                    "{victim}'s control plane did not start again: {e:#}"
                ));
            }
            true
        }
        Drill::DatabaseKill => {
            if let Err(e) = cloud.restart_database(&victim).await {
                violations.push(format!("{victim}'s PostgreSQL did not start again: {e:#}"));
            }
            true
        }
    };
    let back_at = Instant::now();
    let mut released_s: Option<f64> = None;
    if back {
        for w in jobs.iter().filter(|w| w.home == victim) {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let c = cloud.copy_in(&victim, w.id).await;
                let released = c
                    .as_ref()
                    .is_some_and(|c| c.state == JobState::Cancelled && c.moved_to.is_some());
                if released {
                    released_s = Some(back_at.elapsed().as_secs_f64());
                    break;
                }
                if Instant::now() >= deadline {
                    violations.push(format!("back, {victim} never released its copy: {c:?}"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    if cloud.lab().is_some() && back {
        let how = match drill {
            Drill::RegionKill => "booted again (links up, routes back, every process started)",
            _ => "healed (wan0 up, its routes back)",
        };
        notes.push(format!(
            "{victim} {how} {:.1} s after the fault; {}",
            (back_at - broke).as_secs_f64(),
            match released_s {
                Some(s) => format!("it had released its copies {s:.1} s later"),
                None => "it never released its copies".into(),
            }
        ));
    }
    // A retried create with the moved job's key returns the adopted job.
    let w = &jobs[0];
    let spec = trainer_spec(&cloud.trainer(), &w.key, t, &w.log);
    match cloud.tenant.submit(&spec, Some(&w.key)).await {
        Ok(j) if j.id == w.id && j.region != victim => {}
        Ok(j) => violations.push(format!(
            "a retried create answered {} in {}",
            j.id, j.region
        )),
        Err(e) => violations.push(format!("a retried create failed: {e}")),
    }
    // Every acknowledged job ends well, wherever it is.
    let mut ended: Vec<Option<Job>> = Vec::new();
    for w in &jobs {
        let within = Duration::from_secs(150);
        let done = cloud
            .wait_for(w.id, "succeeded", within, |j| {
                j.state == JobState::Succeeded
            })
            .await;
        match done {
            Ok(j) => ended.push(Some(j)),
            Err(e) => {
                violations.push(format!("acknowledged job {} did not succeed: {e}", w.id));
                ended.push(None);
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    violations.extend(watch.await?);
    let mut reports = Vec::new();
    for ((w, j), at) in jobs.iter().zip(ended).zip(at) {
        let failed = w.home == victim;
        let recovered_s = recovered.get(&w.id).copied();
        reports.push(judge(
            w,
            j,
            failed.then_some(at),
            recovered_s,
            t,
            &mut violations,
        ));
    }
    violations.extend(allocated_twice(&cloud, None).await);
    violations.extend(usage_counted_twice(&cloud, &ids, None).await);
    let mut report = finish(cloud, drill, victim, t, reports, violations);
    report.notes = notes;
    Ok(report)
}

/// What the trainer's own log says of job `w` (`ended` as the control
/// plane last saw it): the violations it shows go into `violations`; with
/// `failed_at` (where its log stood when its region broke), what the
/// failure cost it.
fn judge(
    w: &Work,
    ended: Option<Job>,
    failed_at: Option<usize>,
    recovered_s: Option<f64>,
    t: Training,
    violations: &mut Vec<String>,
) -> JobReport {
    let log = trainer::Log::parse(&read_log(&w.log));
    violations.extend(judge_log(w.id, &log, t));
    let lost = failed_at.and_then(|at| log.lost_at(at));
    if failed_at.is_some() && lost.is_none() {
        violations.push(format!("job {}: no run after the failure in its log", w.id));
    }
    if let Some(l) = lost {
        if !log.wrote_before(l.resumed, log.runs.last().map_or(0, |r| r.first)) {
            violations.push(format!(
                "job {} resumed from step {}, a checkpoint it never wrote",
                w.id, l.resumed
            ));
        }
    }
    JobReport {
        id: w.id,
        home: w.home.clone(),
        region: ended.as_ref().map_or("?".into(), |j| j.region.clone()),
        epoch: ended.as_ref().map_or(0, |j| j.epoch),
        state: (ended.as_ref()).map_or("?".into(), |j| j.state.as_str().to_string()),
        recovered_s,
        lost,
        lost_s: lost.map(|l| f64::from(l.steps()) * t.step_s),
        final_step: log.finals.last().copied(),
    }
}

/// What the usage ledger shows broken, merged from every region but
/// `skip` (its own rows and those held for peers) and deduplicated by row
/// id: one row held with two contents, or two rows of a job and rank over
/// overlapping times (GPU time counted twice), each row counted up to its
/// correction if a back-dated release corrected it. Waits a few seconds first,
/// for the last rows to reach the buddies.
async fn usage_counted_twice(cloud: &Cloud, jobs: &[Uuid], skip: Option<&str>) -> Vec<String> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut v = Vec::new();
    let mut rows: BTreeMap<Uuid, gangway_shared::billing::UsageRecord> = BTreeMap::new();
    for r in cloud.names().into_iter().filter(|r| Some(*r) != skip) {
        match cloud.usage_in(r).await {
            Ok(list) => {
                for row in list.into_iter().filter(|row| jobs.contains(&row.job_id)) {
                    match rows.get(&row.usage_id) {
                        Some(held) if *held != row => v.push(format!(
                            "usage row {} differs between regions: {held:?} vs {row:?}",
                            row.usage_id
                        )),
                        Some(_) => {}
                        None => {
                            rows.insert(row.usage_id, row);
                        }
                    }
                }
            }
            Err(e) => v.push(format!("{r}: cannot read its usage ledger: {e:#}")),
        }
    }
    // A row a back-dated release corrected counts only up to the
    // correction (docs/billing.md).
    let mut cut: BTreeMap<Uuid, chrono::DateTime<chrono::Utc>> = BTreeMap::new();
    for r in cloud.names().into_iter().filter(|r| Some(*r) != skip) {
        match cloud.corrections_in(r).await {
            Ok(c) => {
                for (id, at) in c {
                    let e = cut.entry(id).or_insert(at);
                    *e = (*e).min(at);
                }
            }
            Err(e) => v.push(format!("{r}: cannot read its usage corrections: {e:#}")),
        }
    }
    let mut billed: Vec<gangway_shared::billing::UsageRecord> = Vec::new();
    for row in rows.values() {
        let mut row = row.clone();
        if let Some(at) = cut.get(&row.usage_id) {
            row.ended_at = row.ended_at.min(*at);
        }
        if row.ended_at > row.started_at {
            billed.push(row);
        }
    }
    let mut by_worker: BTreeMap<(Uuid, i32), Vec<&gangway_shared::billing::UsageRecord>> =
        BTreeMap::new();
    for row in &billed {
        by_worker
            .entry((row.job_id, row.rank))
            .or_default()
            .push(row);
    }
    for ((job, rank), mut list) in by_worker {
        list.sort_by_key(|r| r.started_at);
        for pair in list.windows(2) {
            if pair[1].started_at < pair[0].ended_at {
                v.push(format!(
                    "job {job} rank {rank}: usage counted twice: {} in {} (epoch {}, {} to {}) \
                     and {} in {} (epoch {}, {} to {})",
                    pair[0].usage_id,
                    pair[0].region,
                    pair[0].epoch,
                    pair[0].started_at,
                    pair[0].ended_at,
                    pair[1].usage_id,
                    pair[1].region,
                    pair[1].epoch,
                    pair[1].started_at,
                    pair[1].ended_at
                ));
            }
        }
    }
    v
}

/// [start, end) of a ledger row.
type Span = (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>);

/// What `dead`'s copies say of its `jobs` (adopted elsewhere): per job
/// and rank, the ledger rows its peers hold of it and the hours its
/// adopter closed (docs/billing.md, "A region that does not come back")
/// must run without a gap from its first row to within a few seconds
/// before `died` (the last heartbeat its peers heard), never after.
async fn billed_from_copies(
    cloud: &Cloud,
    dead: &str,
    jobs: &[Uuid],
    died: chrono::DateTime<chrono::Utc>,
) -> Vec<String> {
    let mut v = Vec::new();
    // Per job and rank, each row's or closing's span, by id.
    let mut pieces: BTreeMap<(Uuid, i32), BTreeMap<Uuid, Span>> = BTreeMap::new();
    let mut closed: BTreeMap<Uuid, usize> = BTreeMap::new();
    for r in cloud.names().into_iter().filter(|r| *r != dead) {
        let rows = match cloud.usage_in(r).await {
            Ok(rows) => rows,
            Err(e) => {
                v.push(format!("{r}: cannot read its usage ledger: {e:#}"));
                continue;
            }
        };
        let closings = match cloud.closings_in(r, dead).await {
            Ok(c) => c.records,
            Err(e) => {
                v.push(format!("{r}: cannot read its closings: {e:#}"));
                continue;
            }
        };
        for c in &closings {
            *closed.entry(c.job_id).or_default() += 1;
        }
        for row in rows.iter().filter(|x| x.region == dead).chain(&closings) {
            if jobs.contains(&row.job_id) {
                (pieces.entry((row.job_id, row.rank)).or_default())
                    .insert(row.usage_id, (row.started_at, row.ended_at));
            }
        }
    }
    for job in jobs {
        if !closed.contains_key(job) {
            v.push(format!(
                "job {job}: its adopter closed none of its placements in {dead}"
            ));
        }
    }
    let slack = chrono::Duration::seconds(5);
    for ((job, rank), held) in pieces {
        let mut spans: Vec<_> = held.into_values().collect();
        spans.sort();
        for pair in spans.windows(2) {
            if (pair[1].0 - pair[0].1).num_milliseconds().abs() > 1 {
                v.push(format!(
                    "job {job} rank {rank}: its copies in other regions leave {} to {} unbilled \
                     or billed twice",
                    pair[0].1, pair[1].0
                ));
            }
        }
        let end = spans.last().map(|s| s.1);
        if end.is_none_or(|e| e < died - slack || e > died + chrono::Duration::seconds(1)) {
            v.push(format!(
                "job {job} rank {rank}: billed from its copies to {end:?}, but {dead} died at {died}"
            ));
        }
    }
    v
}

/// Every region that gave a GPU to two workers at once (`skip`: a region
/// whose database is gone).
async fn allocated_twice(cloud: &Cloud, skip: Option<&str>) -> Vec<String> {
    let mut v = Vec::new();
    for r in cloud.names().into_iter().filter(|r| Some(*r) != skip) {
        match twice_allocated(cloud, r).await {
            Ok(0) => {}
            Ok(n) => v.push(format!("{r}: {n} GPU(s) allocated to two workers at once")),
            Err(e) => v.push(format!("{r}: cannot check its allocations: {e:#}")),
        }
    }
    v
}

/// The report; a failed drill's cloud directory is kept for its logs.
fn finish(
    cloud: Arc<Cloud>,
    drill: Drill,
    region: String,
    training: Training,
    jobs: Vec<JobReport>,
    violations: Vec<String>,
) -> Report {
    let logs = cloud.logs();
    if !violations.is_empty() {
        cloud.keep_logs();
    }
    Report {
        lab: cloud.lab().is_some(),
        drill: drill.as_str().into(),
        region,
        training,
        jobs,
        violations,
        notes: Vec::new(),
        logs,
    }
}

/// The agent-kill drill: see the crate's documentation.
async fn agent_kill(cloud: Arc<Cloud>, tag: &str) -> anyhow::Result<Report> {
    // Checkpoints big enough that their upload takes a while.
    let t = Training {
        checkpoint_mb: 64,
        ..TRAINING
    };
    let key = format!("drill-{tag}-0");
    let log = cloud.shared().join(format!("trainer-{key}.log"));
    let spec = trainer_spec(&cloud.trainer(), &key, t, &log);
    let job = cloud.tenant.submit(&spec, Some(&key)).await?;
    let w = Work {
        key,
        id: job.id,
        home: job.region.clone(),
        log,
    };
    let within = Duration::from_secs(60);
    (cloud.wait_for(w.id, "running", within, |j| j.state == JobState::Running)).await?;
    until_step(&w.log, 2 * t.every + t.every / 2, within).await?;
    let victim = w.home.clone();
    let mut violations = Vec::new();
    // Once a checkpoint is the job's (uploads of 64 MiB take a while on a
    // busy machine), kill the agent while the next one's files are in the
    // store and its manifest is not.
    let within = Duration::from_secs(120);
    (cloud.wait_for(w.id, "a committed checkpoint", within, |j| {
        j.checkpoint.is_some()
    }))
    .await?;
    let uploading = until_uploading(&cloud.store_dir(&victim), w.id, within).await?;
    let at = read_log(&w.log).len();
    cloud.kill_agent(&victim).await?;
    let broke = Instant::now();
    let half = uploading.join(gangway_checkpoint::MANIFEST);
    if half.exists() {
        violations.push(format!(
            "the agent was killed too late: {} committed",
            uploading.display()
        ));
    }
    if let Err(e) = cloud.restart_agent(&victim).await {
        violations.push(format!("{victim}'s agent did not start again: {e:#}"));
    }
    // It runs again once the old worker is gone (and its checkpoint,
    // 64 MiB, is fetched and verified).
    let mut recovered_s = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let l = trainer::Log::parse(&read_log(&w.log));
        if l.runs.iter().any(|r| r.first >= at) {
            recovered_s = Some(broke.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if recovered_s.is_none() {
        violations.push(format!(
            "job {} never ran again after its agent restarted",
            w.id
        ));
    }
    let within = Duration::from_secs(150);
    let ended = match cloud
        .wait_for(w.id, "succeeded", within, |j| {
            j.state == JobState::Succeeded
        })
        .await
    {
        Ok(j) => {
            // The half-uploaded checkpoint never became the job's.
            let newest = j.checkpoint.as_ref().map(|c| c.key.clone());
            let half_key = uploading.strip_prefix(cloud.store_dir(&victim)).ok();
            if newest.is_some_and(|k| half_key.is_some_and(|h| Path::new(&k) == h)) {
                violations.push(format!(
                    "job {}'s newest checkpoint is the half-uploaded {}",
                    w.id,
                    uploading.display()
                ));
            }
            Some(j)
        }
        Err(e) => {
            violations.push(format!("acknowledged job {} did not succeed: {e}", w.id));
            None
        }
    };
    let report = judge(&w, ended, Some(at), recovered_s, t, &mut violations);
    violations.extend(allocated_twice(&cloud, None).await);
    violations.extend(usage_counted_twice(&cloud, &[w.id], None).await);
    Ok(finish(
        cloud,
        Drill::AgentKill,
        victim,
        t,
        vec![report],
        violations,
    ))
}

/// Creates in the global-kill drill's burst.
const BURST: usize = 48;

/// The global-kill drill: see the crate's documentation.
async fn global_kill(cloud: Arc<Cloud>, tag: &str) -> anyhow::Result<Report> {
    use futures_util::StreamExt;
    use std::sync::atomic::AtomicUsize;
    // Short one-GPU trainers: the burst fits the fleet at once.
    let t = Training {
        step_s: 0.1,
        every: 10,
        total: 30,
        checkpoint_mb: 0,
    };
    let (first, second) = (cloud.tenants[0].clone(), cloud.tenants[1].clone());
    let answered = Arc::new(AtomicUsize::new(0));
    let killed: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let killed_ms = Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
    // The killer: the first replica dies once a third of the burst is in.
    let killer = {
        let (cloud, answered, killed) = (cloud.clone(), answered.clone(), killed.clone());
        let killed_ms = killed_ms.clone();
        tokio::spawn(async move {
            while answered.load(Ordering::SeqCst) < BURST / 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            killed_ms.store(now.map_or(0, |d| d.as_millis() as i64), Ordering::SeqCst);
            if let Err(e) = cloud.kill_global(0).await {
                eprintln!("cannot kill global replica 0: {e:#}");
                return;
            }
            *killed.lock().expect("killed lock") = Some(Instant::now());
        })
    };
    let works: Vec<(Work, gangway_shared::api::JobSpec)> = (0..BURST)
        .map(|i| {
            let key = format!("burst-{tag}-{i}");
            let log = cloud.shared().join(format!("trainer-{key}.log"));
            let mut spec = trainer_spec(&cloud.trainer(), &key, t, &log);
            (spec.gpus, spec.gpus_per_worker) = (1, Some(1));
            let w = Work {
                key,
                id: Uuid::nil(),
                home: String::new(),
                log,
            };
            (w, spec)
        })
        .collect();
    // Eight creates at a time at the first replica; what it does not
    // answer is retried at the second with the same key, as a client
    // behind a load balancer would.
    #[allow(clippy::type_complexity)] // spelled out once, here
    let outcomes: Vec<(Work, Result<(Job, bool, Option<f64>), String>)> =
        futures_util::stream::iter(works.into_iter().map(|(mut w, spec)| {
            let (first, second, answered, killed) = (
                first.clone(),
                second.clone(),
                answered.clone(),
                killed.clone(),
            );
            async move {
                let mut at_second = false;
                let deadline = Instant::now() + Duration::from_secs(60);
                let outcome = loop {
                    let via = if at_second { &second } else { &first };
                    match via.submit(&spec, Some(&w.key)).await {
                        Ok(job) => {
                            answered.fetch_add(1, Ordering::SeqCst);
                            let after = (*killed.lock().expect("killed lock"))
                                .filter(|_| at_second)
                                .map(|k| k.elapsed().as_secs_f64());
                            break Ok((job, at_second, after));
                        }
                        Err(e) if Instant::now() >= deadline => break Err(e.to_string()),
                        // Overloaded or unavailable: the same replica again.
                        Err(gangway_shared::client::ClientError::Api { status, .. })
                            if status.as_u16() == 429 || status.as_u16() == 503 =>
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await
                        }
                        Err(gangway_shared::client::ClientError::Api { body, .. }) => {
                            break Err(format!("{}: {}", body.code, body.message))
                        }
                        // No answer: maybe made, maybe not; the other replica.
                        Err(_) => at_second = true,
                    }
                };
                if let Ok((job, _, _)) = &outcome {
                    (w.id, w.home) = (job.id, job.region.clone());
                }
                (w, outcome)
            }
        }))
        .buffer_unordered(8)
        .collect()
        .await;
    killer.abort();
    let mut violations = Vec::new();
    let (mut by_first, mut by_second, mut in_flight) = (0, 0, 0);
    let killed_at_ms = killed_ms.load(Ordering::SeqCst);
    let mut recovered = BTreeMap::new();
    let mut works = Vec::new();
    for (w, outcome) in outcomes {
        match outcome {
            Ok((_, false, _)) => by_first += 1,
            Ok((job, true, after)) => {
                by_second += 1;
                // Made through the dead replica, never answered by it.
                if job.created_at.timestamp_millis() < killed_at_ms {
                    in_flight += 1;
                }
                if let Some(a) = after {
                    recovered.insert(w.id, a);
                }
            }
            Err(e) => violations.push(format!("create {} never acknowledged: {e}", w.key)),
        }
        if !w.id.is_nil() {
            works.push(w);
        }
    }
    if killed.lock().expect("killed lock").is_none() {
        violations.push("the first global replica was never killed".into());
    }
    // Every acknowledged job: there once, and done.
    let mut ended = Vec::new();
    for w in &works {
        let q = gangway_shared::client::ListQuery {
            name: Some(w.key.clone()),
            ..Default::default()
        };
        match second.list(&q).await {
            Ok(l) if l.jobs.len() == 1 && l.jobs[0].id == w.id => {}
            Ok(l) => violations.push(format!(
                "create {} made {} job(s): {:?}",
                w.key,
                l.jobs.len(),
                l.jobs.iter().map(|j| j.id).collect::<Vec<_>>()
            )),
            Err(e) => violations.push(format!("cannot list {}: {e}", w.key)),
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let done = loop {
            match second.get(w.id).await {
                Ok(j) if j.state == JobState::Succeeded => break Some(j),
                Ok(j) if j.state.is_terminal() => {
                    violations.push(format!("job {} ended {}", w.id, j.state.as_str()));
                    break Some(j);
                }
                _ if Instant::now() >= deadline => {
                    violations.push(format!("acknowledged job {} did not succeed", w.id));
                    break None;
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        ended.push(done);
    }
    let mut reports = Vec::new();
    for (w, j) in works.iter().zip(ended) {
        let r = recovered.get(&w.id).copied();
        reports.push(judge(w, j, None, r, t, &mut violations));
    }
    violations.extend(allocated_twice(&cloud, None).await);
    let ids: Vec<Uuid> = works.iter().map(|w| w.id).collect();
    violations.extend(usage_counted_twice(&cloud, &ids, None).await);
    let first_after = recovered
        .values()
        .copied()
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    let mut report = finish(
        cloud,
        Drill::GlobalKill,
        "global-0".into(),
        t,
        reports,
        violations,
    );
    report.notes = vec![
        format!(
            "{BURST} keyed creates, 8 at a time: {by_first} answered by global-0, {by_second} \
             by global-1 after global-0 died, of which {in_flight} had been made through global-0 \
             but not answered (the retry with the same key returned that job)"
        ),
        match first_after {
            Some(s) => format!("global-1 answered its first retry {s:.2} s after the kill"),
            None => "no create was retried".into(),
        },
    ];
    Ok(report)
}

/// Waits until a checkpoint of `job` is being uploaded into the store at
/// `store`: a key with files and no manifest; returns its directory.
async fn until_uploading(store: &Path, job: Uuid, within: Duration) -> anyhow::Result<PathBuf> {
    let root = store.join("jobs").join(job.to_string());
    let deadline = Instant::now() + within;
    loop {
        for epoch in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            for key in std::fs::read_dir(epoch.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let dir = key.path();
                let files = std::fs::read_dir(&dir).map_or(0, |d| d.count());
                if files > 0 && !dir.join(gangway_checkpoint::MANIFEST).exists() {
                    return Ok(dir);
                }
            }
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "no checkpoint upload of job {job} seen in {}",
                root.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a job's trainer log shows broken: two runs stepping at once, or an
/// end other than one `final step` at the full count.
fn judge_log(id: Uuid, log: &trainer::Log, t: Training) -> Vec<String> {
    let mut v = Vec::new();
    for (a, b) in log.overlaps() {
        v.push(format!(
            "job {id} trained twice at once: pid {} on {} (to step {}) and pid {} on {} (from step {})",
            a.pid, a.node, a.reached, b.pid, b.node, b.from
        ));
    }
    if log.finals != [t.total] {
        v.push(format!(
            "job {id} ended with final steps {:?}, not once at {}",
            log.finals, t.total
        ));
    }
    v
}

/// How many pairs of allocations in region `region`'s database gave one
/// GPU to two workers over overlapping times.
async fn twice_allocated(cloud: &Cloud, region: &str) -> anyhow::Result<i64> {
    let client = cloud.database_client(region).await?;
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM allocations a JOIN allocations b
               ON a.node_id = b.node_id AND a.gpu_index = b.gpu_index AND a.alloc_id < b.alloc_id
             WHERE tstzrange(a.allocated_at, coalesce(a.released_at, 'infinity'))
                && tstzrange(b.allocated_at, coalesce(b.released_at, 'infinity'))",
            &[],
        )
        .await?
        .get(0);
    Ok(n)
}
