-- A queued job that preempted running ones to start has the first claim on
-- what they free until `claim_until` (issue 26, `gangway_sched::Plan::claims`):
-- each snapshot reads the claims not yet over into `Snapshot::claims`, and
-- the core draws those jobs before every priority class. Without it, a job
-- that reclaimed its tenant's guarantee watched a higher class (often its
-- victims, requeued) take what it freed, and reclaimed again.
ALTER TABLE jobs ADD COLUMN claim_until timestamptz;
CREATE INDEX jobs_claims ON jobs (claim_until) WHERE claim_until IS NOT NULL;
