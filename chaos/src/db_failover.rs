//! The database-failover drill (`gangway chaos database-failover`): a
//! region's database is a Patroni cluster (a primary, synchronous
//! standbys, etcd; [`gangway_devkit::PatroniCluster`]), and under load — a
//! trainer job running past its second checkpoint, creates pinned to the
//! region every half second through the global tier — first the primary's
//! PostgreSQL is killed (Patroni restarts it or fails over), then, once a
//! synchronous standby streams again, the new primary's whole member (its
//! host, as far as the cluster can tell). On a lab of machines
//! (`--lab`: the members and etcd on hosts of their own) that second kill
//! is the primary's host losing power: its links go down before its
//! processes die, so the region's connections to it hear nothing at all.
//!
//! It checks: no region fences and no job moves to another region; the
//! trainer job runs on, once, through both (one run in its own log, epoch
//! 1, every step); every acknowledged create exists and succeeds; a
//! refused create is a 503 with `Retry-After`, never a 500 or anything
//! else; no GPU allocated twice, no usage counted twice. It reports, for
//! each kill, the time to the first acknowledged create and to the first
//! placement after it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use gangway_shared::api::{JobSpec, JobState};
use gangway_shared::client::ClientError;
use reqwest::StatusCode;
use uuid::Uuid;

use crate::cloud::{trainer_spec, Cloud, Training};
use crate::trainer;
use crate::{
    allocated_twice, finish, judge, read_log, until_step, usage_counted_twice, Drill, Report, Work,
};

/// The trainer job's training: a minute of steps, a checkpoint every 2 s
/// (long enough to outlast both failovers).
pub const FAILOVER_TRAINING: Training = Training {
    step_s: 0.1,
    every: 20,
    total: 700,
    checkpoint_mb: 0,
};

/// How often a create is sent to the region.
const CREATE_EVERY: Duration = Duration::from_millis(500);

/// What the creates saw.
#[derive(Default)]
struct Creates {
    /// Acknowledged: id, and when.
    acked: Vec<(Uuid, Instant)>,
    /// Refused as they may be: 503 with Retry-After.
    retryable: usize,
    /// Anything else: a violation each.
    wrong: Vec<String>,
}

/// What the drill kills of the primary.
#[derive(Clone, Copy)]
enum Kill {
    /// Its PostgreSQL (Patroni starts it again, or fails over).
    Postgres,
    /// Its Patroni and PostgreSQL: their sockets close.
    Member,
    /// Its host, on a lab of machines: power cut, links down first.
    Host,
}

impl Kill {
    /// How the report's notes name it.
    fn as_str(self) -> &'static str {
        match self {
            Kill::Postgres => "PostgreSQL killed",
            Kill::Member => "member killed",
            Kill::Host => "host powered off",
        }
    }
}

/// One kill and how the region came back from it.
struct Recovery {
    what: &'static str,
    member: String,
    write_s: Option<f64>,
    placement_s: Option<f64>,
}

pub(crate) async fn run(cloud: Arc<Cloud>, tag: &str) -> anyhow::Result<Report> {
    let t = FAILOVER_TRAINING;
    let (victim, patroni) = (cloud.patroni())
        .map(|(n, c)| (n.to_string(), c.clone()))
        .context(
            "the database-failover drill needs a region whose database is a Patroni cluster",
        )?;
    let key = format!("drill-{tag}-train");
    let log = cloud.shared().join(format!("trainer-{key}.log"));
    let mut spec = trainer_spec(&cloud.trainer(), &key, t, &log);
    spec.region = Some(victim.clone());
    let job = cloud.tenant.submit(&spec, Some(&key)).await?;
    let work = Work {
        key,
        id: job.id,
        home: job.region.clone(),
        log,
    };
    let within = Duration::from_secs(60);
    (cloud.wait_for(work.id, "running", within, |j| j.state == JobState::Running)).await?;
    until_step(&work.log, 2 * t.every + t.every / 2, within).await?;
    let mut violations = Vec::new();

    // Watchers: the victim fenced (sampled every 100 ms), and the creates.
    let stop = Arc::new(AtomicBool::new(false));
    let fenced = {
        let (cloud, stop, victim) = (cloud.clone(), stop.clone(), victim.clone());
        tokio::spawn(async move {
            let mut seen = 0u32;
            while !stop.load(Ordering::SeqCst) {
                if cloud.fenced(&victim).await == Some(true) {
                    seen += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        })
    };
    let creates = Arc::new(Mutex::new(Creates::default()));
    let creating = {
        let (cloud, stop, victim, creates) =
            (cloud.clone(), stop.clone(), victim.clone(), creates.clone());
        let tag = tag.to_string();
        tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) {
                // A refused create is retried with its key, as a client
                // following Retry-After would.
                let key = format!("drill-{tag}-c{i}");
                match cloud
                    .tenant
                    .submit(&short_job(&key, &victim), Some(&key))
                    .await
                {
                    Ok(j) => {
                        creates.lock().unwrap().acked.push((j.id, Instant::now()));
                        i += 1;
                    }
                    Err(ClientError::Api {
                        status: StatusCode::SERVICE_UNAVAILABLE,
                        retry_after: Some(_),
                        ..
                    }) => creates.lock().unwrap().retryable += 1,
                    Err(e) => {
                        creates
                            .lock()
                            .unwrap()
                            .wrong
                            .push(format!("create {key}: {e}"));
                        i += 1;
                    }
                }
                tokio::time::sleep(CREATE_EVERY).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut recoveries = Vec::new();
    // On a lab of machines the second kill is the primary's host losing
    // power (links down first: its peers hear no goodbye), not only its
    // processes.
    let second = if cloud.lab().is_some() {
        Kill::Host
    } else {
        Kill::Member
    };
    for kill in [Kill::Postgres, second] {
        let what = kill.as_str();
        let c = patroni.clone();
        let member = tokio::task::spawn_blocking(move || c.primary())
            .await?
            .context("the cluster has no primary to kill")?;
        let killed = Instant::now();
        let (c, m) = (patroni.clone(), member.clone());
        match (kill, cloud.lab()) {
            (Kill::Host, Some(lab)) => {
                tokio::task::block_in_place(|| lab.power_off(&[member.as_str()]))?
            }
            (Kill::Postgres, _) => {
                tokio::task::spawn_blocking(move || c.kill_postgres(&m).map(|_| ())).await??
            }
            _ => tokio::task::spawn_blocking(move || c.kill_member(&m)).await??,
        }
        let r = recovered(&cloud, &creates, killed, Duration::from_secs(60)).await;
        recoveries.push(Recovery {
            what,
            member: member.clone(),
            write_s: r.0,
            placement_s: r.1,
        });
        if r.0.is_none() {
            violations.push(format!(
                "{what} ({member}): no create acknowledged within 60 s"
            ));
        }
        if r.1.is_none() {
            violations.push(format!("{what} ({member}): nothing placed within 60 s"));
        }
        // The next kill only once a synchronous standby streams again (a
        // primary killed before would have no one to fail over to).
        let c = patroni.clone();
        if let Err(e) =
            tokio::task::spawn_blocking(move || c.wait_for_sync_standby(Duration::from_secs(90)))
                .await?
        {
            violations.push(format!("after {what}: no synchronous standby again: {e:#}"));
            break;
        }
    }
    // A few more creates on the cluster as it is now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    creating.await?;
    let fenced = fenced.await?;
    if fenced > 0 {
        violations.push(format!(
            "{victim} fenced while its database failed over (seen in {fenced} samples)"
        ));
    }
    let creates = std::mem::take(&mut *creates.lock().unwrap());
    violations.extend(creates.wrong.iter().cloned());

    // The trainer job ran on, once, where it was.
    let ended = cloud
        .wait_for(work.id, "succeeded", Duration::from_secs(150), |j| {
            j.state == JobState::Succeeded
        })
        .await;
    let ended = match ended {
        Ok(j) => {
            if (j.region.as_str(), j.epoch) != (victim.as_str(), 1) {
                violations.push(format!(
                    "job {} moved: it ended in {} at epoch {}",
                    j.id, j.region, j.epoch
                ));
            }
            Some(j)
        }
        Err(e) => {
            violations.push(format!("the trainer job did not succeed: {e:#}"));
            None
        }
    };
    let runs = trainer::Log::parse(&read_log(&work.log)).runs.len();
    if runs != 1 {
        violations.push(format!(
            "job {}: {runs} runs in its log, not one (it restarted)",
            work.id
        ));
    }
    let report = judge(&work, ended, None, None, t, &mut violations);

    // Every acknowledged create exists and succeeds.
    let ids: Vec<Uuid> = creates.acked.iter().map(|(id, _)| *id).collect();
    violations.extend(all_succeed(&cloud, &ids, Duration::from_secs(120)).await);
    let mut all = ids.clone();
    all.push(work.id);
    violations.extend(allocated_twice(&cloud, None).await);
    violations.extend(usage_counted_twice(&cloud, &all, None).await);

    let mut report = finish(
        cloud,
        Drill::DatabaseFailover,
        victim,
        t,
        vec![report],
        violations,
    );
    let s = |v: Option<f64>| v.map_or("never".into(), |s| format!("{s:.1} s"));
    for r in &recoveries {
        report.notes.push(format!(
            "{} ({}): first create acknowledged after {}, first placement after {}",
            r.what,
            r.member,
            s(r.write_s),
            s(r.placement_s)
        ));
    }
    report.notes.push(format!(
        "creates: {} acknowledged, {} refused as retryable (503 with Retry-After), {} otherwise",
        creates.acked.len(),
        creates.retryable,
        creates.wrong.len()
    ));
    Ok(report)
}

/// A one-GPU job of `true`, pinned to `region`.
fn short_job(name: &str, region: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": 1, "gpus_per_worker": 1, "gpu_type": "h100",
        "estimated_duration_s": 5, "command": ["true"], "region": region
    }))
    .expect("a valid job spec")
}

/// Seconds from `killed` to the first create acknowledged after it, and
/// to the first placement of a job created after it (polled every 100 ms),
/// waiting at most `within`.
async fn recovered(
    cloud: &Cloud,
    creates: &Mutex<Creates>,
    killed: Instant,
    within: Duration,
) -> (Option<f64>, Option<f64>) {
    let deadline = killed + within;
    let mut write = None;
    while Instant::now() < deadline {
        let after: Vec<(Uuid, Instant)> = (creates.lock().unwrap().acked.iter())
            .filter(|(_, at)| *at > killed)
            .copied()
            .collect();
        if write.is_none() {
            write = after
                .first()
                .map(|(_, at)| at.duration_since(killed).as_secs_f64());
        }
        for (id, _) in &after {
            if let Ok(j) = cloud.tenant.get(*id).await {
                if !matches!(j.state, JobState::Queued) {
                    return (write, Some(killed.elapsed().as_secs_f64()));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (write, None)
}

/// A violation for each of `ids` that is not there or has not succeeded
/// within `within` (all of them together).
async fn all_succeed(cloud: &Cloud, ids: &[Uuid], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut last: BTreeMap<Uuid, String> = ids.iter().map(|id| (*id, "unseen".into())).collect();
    loop {
        let open: Vec<Uuid> = last.keys().copied().collect();
        for id in open {
            match cloud.tenant.get(id).await {
                Ok(j) if j.state == JobState::Succeeded => {
                    last.remove(&id);
                }
                Ok(j) => {
                    last.insert(id, format!("{} in {}", j.state.as_str(), j.region));
                }
                Err(e) => {
                    last.insert(id, e.to_string());
                }
            }
        }
        if last.is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (last.into_iter())
        .map(|(id, why)| format!("acknowledged create {id} did not succeed: {why}"))
        .collect()
}
