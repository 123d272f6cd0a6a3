-- Gangway regional schema, version 3: elastic gangs. What is persisted here
-- and why is described in src/store/mod.rs.

ALTER TABLE jobs
    -- The fewest workers an elastic gang may run with (`min_gpus /
    -- gpus_per_worker`); NULL: all or nothing.
    ADD COLUMN min_workers integer
        CHECK (min_workers IS NULL OR (min_workers > 0 AND min_workers <= workers)),
    -- How many workers the gang's current run was placed with: ranks
    -- 0 … run_workers − 1 run; the other ranks stay pending and are not part
    -- of it. Set when it is placed, cleared when it requeues, kept when it
    -- ends (the last run's); NULL while it waits, and for array jobs.
    ADD COLUMN run_workers integer
        CHECK (run_workers IS NULL OR (run_workers > 0 AND run_workers <= workers)),
    -- How many of `preemptions` were restarts to grow (an elastic gang asked
    -- to checkpoint and restart larger): the cap on priority preemptions
    -- does not count them.
    ADD COLUMN grows integer NOT NULL DEFAULT 0 CHECK (grows >= 0);

-- Gangs placed before this version run (or ran) with all their workers.
UPDATE jobs SET run_workers = workers
WHERE mode = 'gang'
  AND (state IN ('starting', 'running', 'preempting', 'cancelling') OR started_at IS NOT NULL);
