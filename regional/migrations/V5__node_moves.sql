-- Gangway regional schema, version 5: moves caused by a node counted apart
-- from preemptions. What is persisted here and why is described in
-- src/store/mod.rs.

ALTER TABLE jobs
    -- How many of `preemptions` were moves for a node's sake (a drain, a
    -- health action, a lost node, maintenance, a fenced agent): like
    -- `grows`, they do not use up the job's allowance of priority
    -- preemptions (the snapshot's `Running.preemptions` leaves them out).
    ADD COLUMN node_moves integer NOT NULL DEFAULT 0 CHECK (node_moves >= 0);

-- Moves already recorded as preemptions with a node cause.
UPDATE jobs j SET node_moves = m.n
FROM (SELECT job_id, count(*)::int AS n FROM job_events
      WHERE kind = 'preempted'
        AND detail->>'cause' IN ('drain', 'maintenance', 'repair', 'health', 'node_lost', 'fenced')
      GROUP BY job_id) m
WHERE m.job_id = j.job_id;
