//! The simulated executor: no process, only a timer.

use tokio::time::sleep;

use super::{Control, Exit, WorkerSpec, CHECKPOINTED, MAX_DURATION_EXCEEDED, STOPPED};

/// A simulated checkpoint: the fraction of the run done, `sim:0.25`.
fn progress_of(restore_from: Option<&str>) -> f64 {
    restore_from
        .and_then(|r| r.strip_prefix("sim:"))
        .and_then(|f| f.parse::<f64>().ok())
        .filter(|f| f.is_finite())
        .map(|f| f.clamp(0.0, 1.0))
        .unwrap_or(0.0)
}

const SIGTERM: i32 = 15;

/// Runs for `spec.run_for` and exits 0, unless `max_duration` is shorter or
/// a stop comes first; either ends it at once as if by SIGTERM.
pub(crate) async fn run(spec: &WorkerSpec, control: &Control) -> Exit {
    // A restored run only does what its checkpoint had left.
    let done_before = progress_of(spec.restore_from.as_deref());
    let remaining = spec.run_for.mul_f64(1.0 - done_before);
    let limited = matches!(spec.max_duration, Some(max) if max < remaining);
    let lasts = match spec.max_duration {
        Some(max) if limited => max,
        _ => remaining,
    };
    let started = tokio::time::Instant::now();
    let terminated = |message: &str| Exit {
        exit_code: None,
        signal: Some(SIGTERM),
        message: Some(message.to_string()),
        checkpoint: None,
    };
    tokio::select! {
        _ = sleep(lasts) => {
            if limited {
                terminated(MAX_DURATION_EXCEEDED)
            } else {
                Exit {
                    exit_code: Some(0),
                    signal: None,
                    message: Some("simulated run finished".to_string()),
                    checkpoint: None,
                }
            }
        }
        _ = control.stop.cancelled() => terminated(STOPPED),
        _ = control.kill.cancelled() => terminated(STOPPED),
        _ = control.checkpoint.cancelled() => {
            // Checkpointing is instant here: record how far the run got.
            let total = spec.run_for.as_secs_f64();
            let done = if total > 0.0 {
                done_before + started.elapsed().as_secs_f64() / total
            } else {
                1.0
            };
            Exit {
                checkpoint: Some(format!("sim:{:.6}", done.min(1.0))),
                ..terminated(CHECKPOINTED)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::executor::test_support::spec;
    use crate::executor::WorkerSpec;
    use gangway_shared::agent::Assignment;

    fn sim_spec(estimated_s: i64, max_s: Option<i64>, time_factor: f64) -> WorkerSpec {
        let base = spec(&["train"]);
        let a = Assignment {
            job_id: base.key.job_id,
            tenant: "acme".into(),
            rank: 0,
            attempt: 1,
            desired: gangway_shared::agent::Desired::Run,
            node_id: "node-a".into(),
            gpus: vec![0],
            world_size: 1,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            command: vec!["train".into()],
            env: Default::default(),
            estimated_duration_s: estimated_s,
            max_duration_s: max_s,
            grace_period_s: 30,
            checkpoint_deadline_s: 5,
            restore_from: None,
            epoch: 1,
            started: false,
        };
        WorkerSpec::from_assignment(&a, crate::ExecutorKind::Sim, time_factor)
    }

    #[tokio::test(start_paused = true)]
    async fn finishes_after_the_scaled_estimated_duration() {
        let spec = sim_spec(100, None, 0.01);
        assert_eq!(spec.run_for, Duration::from_secs(1));
        let control = Control::default();
        let start = tokio::time::Instant::now();
        let exit = run(&spec, &control).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(exit.exit_code, Some(0));
        assert_eq!(exit.signal, None);
        assert_eq!(exit.message.as_deref(), Some("simulated run finished"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_it_at_once_with_sigterm() {
        let spec = sim_spec(100, None, 0.01);
        let control = Control::default();
        let task = tokio::spawn({
            let control = control.clone();
            async move { run(&spec, &control).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        control.stop.cancel();
        let exit = task.await.unwrap();
        assert_eq!(exit.exit_code, None);
        assert_eq!(exit.signal, Some(15));
        assert_eq!(exit.message.as_deref(), Some(STOPPED));
    }

    #[tokio::test(start_paused = true)]
    async fn max_duration_is_scaled_too() {
        let spec = sim_spec(100, Some(50), 0.01);
        let start = tokio::time::Instant::now();
        let exit = run(&spec, &Control::default()).await;
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        assert_eq!(exit.signal, Some(15));
        assert_eq!(exit.message.as_deref(), Some(MAX_DURATION_EXCEEDED));
    }
}
