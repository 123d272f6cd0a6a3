//! What the example trainer's log (`TRAINER_LOG` with `TRAINER_LOG_STEPS=1`)
//! says happened to a job: which process ran which steps on which node,
//! which checkpoints it wrote, where each run resumed, and how it ended.
//! The drills judge from it what no control plane can fake: whether two
//! copies of a job ever trained at once, how much work a failure cost, and
//! whether the job ended with the right step count.

use serde::Serialize;

/// One run of the trainer: a process, from its start line to its last step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub pid: u32,
    pub node: String,
    /// The step it resumed from (0: from scratch).
    pub from: u32,
    /// The last step it finished (`from` when it finished none).
    pub reached: u32,
    /// Byte offsets in the log of its start line and its last line.
    pub first: usize,
    pub last: usize,
}

/// The log, read.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// Runs in the order they started.
    pub runs: Vec<Run>,
    /// Every checkpoint written: (byte offset, step).
    pub checkpoints: Vec<(usize, u32)>,
    /// Every `final step N` line's N.
    pub finals: Vec<u32>,
}

/// What a failure cost a job, in steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Lost {
    /// Steps the run at the failure had finished, and where the next run
    /// resumed.
    pub reached: u32,
    pub resumed: u32,
    /// Of the lost steps: those after the run's last checkpoint (the
    /// checkpoint interval's share), and those between that checkpoint and
    /// the one resumed from (not uploaded or not replicated in time).
    pub since_checkpoint: u32,
    pub unreplicated: u32,
}

impl Lost {
    pub fn steps(&self) -> u32 {
        self.reached.saturating_sub(self.resumed)
    }
}

impl Log {
    pub fn parse(text: &str) -> Log {
        let mut log = Log::default();
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let at = offset;
            offset += line.len();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["start", "pid", pid, "node", node, "from", "step", from] => {
                    if let (Ok(pid), Ok(from)) = (pid.parse(), from.parse()) {
                        log.runs.push(Run {
                            pid,
                            node: node.to_string(),
                            from,
                            reached: from,
                            first: at,
                            last: at,
                        });
                    }
                }
                ["step", n, "pid", pid] => {
                    let (Ok(n), Ok(pid)) = (n.parse::<u32>(), pid.parse::<u32>()) else {
                        continue;
                    };
                    if let Some(run) = log.runs.iter_mut().rev().find(|r| r.pid == pid) {
                        run.reached = run.reached.max(n);
                        run.last = at;
                    }
                }
                ["checkpoint", name] => {
                    if let Some(Ok(n)) = name.strip_prefix("step-").map(str::parse) {
                        log.checkpoints.push((at, n));
                    }
                }
                ["final", "step", n] => {
                    if let Ok(n) = n.parse() {
                        log.finals.push(n);
                    }
                }
                _ => {}
            }
        }
        log
    }

    /// Pairs of runs that trained at the same time: the second started
    /// before the first's last step.
    pub fn overlaps(&self) -> Vec<(&Run, &Run)> {
        let mut out = Vec::new();
        for (i, a) in self.runs.iter().enumerate() {
            for b in &self.runs[i + 1..] {
                if b.first < a.last {
                    out.push((a, b));
                }
            }
        }
        out
    }

    /// What a failure when the log was `at` bytes long cost: the run going
    /// then against the next run's start. `None` when no run was going or
    /// none came after.
    pub fn lost_at(&self, at: usize) -> Option<Lost> {
        let i = self.runs.iter().rposition(|r| r.first < at)?;
        let (run, next) = (&self.runs[i], self.runs.get(i + 1)?);
        let written = (self.checkpoints.iter())
            .filter(|(o, n)| *o > run.first && *o < next.first && *n <= run.reached)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(run.from)
            .max(next.from.min(run.reached));
        Some(Lost {
            reached: run.reached,
            resumed: next.from,
            since_checkpoint: run.reached - written,
            unreplicated: written.saturating_sub(next.from),
        })
    }

    /// Whether `step` is a checkpoint written before byte `at` (or 0).
    pub fn wrote_before(&self, step: u32, at: usize) -> bool {
        step == 0 || (self.checkpoints.iter()).any(|(o, n)| *n == step && *o < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(lines: &[&str]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn a_failover_resumed_from_an_older_checkpoint_costs_the_steps_since_it() {
        let text = log(&[
            "attempt 0 rank 0 resumed from step 0",
            "start pid 10 node r1-s0-l0-n0 from step 0",
            "step 1 pid 10",
            "step 2 pid 10",
            "checkpoint step-2",
            "step 3 pid 10",
            "step 4 pid 10",
            "checkpoint step-4",
            "step 5 pid 10",
        ]);
        let at = text.len();
        let text = text
            + &log(&[
                "start pid 20 node r2-s0-l0-n1 from step 2",
                "step 3 pid 20",
                "step 4 pid 20",
                "final step 4",
            ]);
        let l = Log::parse(&text);
        assert_eq!(l.runs.len(), 2);
        assert_eq!((l.runs[0].reached, l.runs[1].from), (5, 2));
        assert!(l.overlaps().is_empty());
        let lost = l.lost_at(at).unwrap();
        assert_eq!(lost.steps(), 3);
        assert_eq!((lost.since_checkpoint, lost.unreplicated), (1, 2));
        assert_eq!(l.finals, [4]);
        assert!(l.wrote_before(2, at) && !l.wrote_before(3, at));
    }

    #[test]
    fn two_runs_stepping_at_once_overlap() {
        let l = Log::parse(&log(&[
            "start pid 10 node r1-s0-l0-n0 from step 0",
            "step 1 pid 10",
            "start pid 20 node r2-s0-l0-n0 from step 0",
            "step 1 pid 20",
            "step 2 pid 10",
        ]));
        let o = l.overlaps();
        assert_eq!(o.len(), 1);
        assert_eq!((o[0].0.pid, o[0].1.pid), (10, 20));
    }

    #[test]
    fn a_run_stopped_at_its_checkpoint_loses_nothing() {
        let text = log(&[
            "start pid 10 node r1-s0-l0-n0 from step 0",
            "step 1 pid 10",
            "checkpoint step-1",
        ]);
        let at = text.len();
        let l = Log::parse(&(text + &log(&["start pid 11 node r2-s0-l0-n0 from step 1"])));
        let lost = l.lost_at(at).unwrap();
        assert_eq!(
            (lost.steps(), lost.since_checkpoint, lost.unreplicated),
            (0, 0, 0)
        );
        assert!(Log::parse("").lost_at(0).is_none());
    }
}
