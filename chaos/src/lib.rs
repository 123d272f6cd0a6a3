//! Failure drills against a local cloud (`gangway chaos <drill>`,
//! docs/failover.md): each starts its own cloud of three regions
//! ([`cloud::Cloud`]), runs a workload, breaks something, and checks the
//! invariants afterwards — no acknowledged job lost, no job running in two
//! regions at once (every region's own copy sampled every 100 ms), every
//! job ending well — and reports what happened and how long recovery took.
//!
//! - `region-kill`: a whole region (control plane and agent) is killed;
//!   its jobs must run again in another region at the next epoch, and a
//!   retried create must return the adopted job.
//! - `partition`: a region is cut off from its peers and the global tier
//!   (its agent still reaches it); it must fence and stop its job, its
//!   buddy must adopt it, and once healed the home must release its copy.

pub mod cloud;
pub mod procs;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_shared::api::JobState;
use serde::Serialize;
use uuid::Uuid;

use cloud::{spec, Cloud, REGIONS};

/// A drill's name as `gangway chaos` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drill {
    RegionKill,
    Partition,
}

impl std::str::FromStr for Drill {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "region-kill" => Ok(Drill::RegionKill),
            "partition" => Ok(Drill::Partition),
            _ => Err(format!("unknown drill {s:?}: region-kill or partition")),
        }
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
}

/// What a drill found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub drill: String,
    /// The region broken.
    pub region: String,
    pub jobs: Vec<JobReport>,
    /// Every broken invariant, in words; empty when the drill passed.
    pub violations: Vec<String>,
    /// Where the processes' logs are (kept only with `keep`).
    pub logs: String,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "drill {} on region {}", self.drill, self.region)?;
        writeln!(
            f,
            "{:<38} {:<6} {:<6} {:>5} {:<10} {:>10}",
            "JOB", "HOME", "NOW", "EPOCH", "STATE", "RECOVERED"
        )?;
        for j in &self.jobs {
            writeln!(
                f,
                "{:<38} {:<6} {:<6} {:>5} {:<10} {:>10}",
                j.id,
                j.home,
                j.region,
                j.epoch,
                j.state,
                j.recovered_s.map_or("-".into(), |s| format!("{s:.1} s"))
            )?;
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
/// and returns each moment one ran in two regions at once.
fn watch_twice(
    cloud: Arc<Cloud>,
    jobs: Vec<Uuid>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut twice = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            for id in &jobs {
                let mut live = Vec::new();
                for r in REGIONS {
                    if let Some(j) = cloud.copy_in(r, *id).await {
                        if matches!(j.state, JobState::Starting | JobState::Running) {
                            live.push(r);
                        }
                    }
                }
                if live.len() > 1 {
                    twice.push(format!("job {id} running in {live:?} at once"));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        twice
    })
}

/// Runs `drill` on a cloud of `bin` (short timers with `short`).
pub async fn run(drill: Drill, bin: &Path, short: bool) -> anyhow::Result<Report> {
    let cloud = Arc::new(Cloud::start(bin, short).await);
    let n = match drill {
        Drill::RegionKill => 2,
        Drill::Partition => 1,
    };
    // The workload: keyed jobs, every one running before the failure.
    let mut jobs = Vec::new();
    for i in 0..n {
        let key = format!("drill-{i}");
        let job = cloud.tenant.submit(&spec(&key), Some(&key)).await?;
        jobs.push((key, job.id, job.region.clone()));
    }
    for (_, id, _) in &jobs {
        let within = Duration::from_secs(60);
        (cloud.wait_for(*id, "running", within, |j| j.state == JobState::Running)).await?;
    }
    let victim = jobs[0].2.clone();
    let ids: Vec<Uuid> = jobs.iter().map(|(_, id, _)| *id).collect();
    let mut violations = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    let watch = watch_twice(cloud.clone(), ids.clone(), stop.clone());
    let broke = Instant::now();
    match drill {
        Drill::RegionKill => cloud.kill(&victim),
        Drill::Partition => cloud.partition(&victim, true),
    }
    // Each of the victim's jobs runs again elsewhere at the next epoch.
    let mut recovered = std::collections::BTreeMap::new();
    for (_, id, home) in jobs.iter().filter(|(_, _, r)| *r == victim) {
        let moved = cloud
            .wait_for(*id, "running elsewhere", Duration::from_secs(90), |j| {
                j.state == JobState::Running && j.region != *home
            })
            .await;
        match moved {
            Ok(j) if j.epoch == 2 => {
                recovered.insert(*id, broke.elapsed().as_secs_f64());
            }
            Ok(j) => violations.push(format!("job {id} moved at epoch {}, not 2", j.epoch)),
            Err(e) => violations.push(e.to_string()),
        }
    }
    if drill == Drill::Partition {
        let copy = cloud.copy_in(&victim, ids[0]).await;
        if copy.is_some_and(|c| matches!(c.state, JobState::Starting | JobState::Running)) {
            violations.push(format!("the cut-off region {victim} still runs its job"));
        }
        // Healed: the home releases its copy, naming the new owner.
        cloud.partition(&victim, false);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = cloud.copy_in(&victim, ids[0]).await;
            let released = c
                .as_ref()
                .is_some_and(|c| c.state == JobState::Cancelled && c.moved_to.is_some());
            if released {
                break;
            }
            if Instant::now() >= deadline {
                violations.push(format!("healed, {victim} never released its copy: {c:?}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // A retried create with the moved job's key returns the adopted job.
    let (key, id, _) = &jobs[0];
    match cloud.tenant.submit(&spec(key), Some(key)).await {
        Ok(j) if j.id == *id && j.region != victim => {}
        Ok(j) => violations.push(format!(
            "a retried create answered {} in {}",
            j.id, j.region
        )),
        Err(e) => violations.push(format!("a retried create failed: {e}")),
    }
    // Every acknowledged job ends well, wherever it is.
    let mut reports = Vec::new();
    for (_, id, home) in &jobs {
        let within = Duration::from_secs(150);
        let done = cloud
            .wait_for(*id, "succeeded", within, |j| j.state == JobState::Succeeded)
            .await;
        match done {
            Ok(j) => reports.push(JobReport {
                id: *id,
                home: home.clone(),
                region: j.region.clone(),
                epoch: j.epoch,
                state: j.state.as_str().to_string(),
                recovered_s: recovered.get(id).copied(),
            }),
            Err(e) => violations.push(format!("acknowledged job {id} did not succeed: {e}")),
        }
    }
    stop.store(true, Ordering::SeqCst);
    violations.extend(watch.await?);
    Ok(Report {
        drill: match drill {
            Drill::RegionKill => "region-kill",
            Drill::Partition => "partition",
        }
        .into(),
        region: victim,
        jobs: reports,
        violations,
        logs: cloud.dir.path().display().to_string(),
    })
}
