-- The usage ledger (issue 8, docs/billing.md): every allocation interval,
-- once it has ended, as one append-only row per worker placement — the job,
-- its ownership epoch, attempt and rank, the tenant, region, GPU type and
-- count, start, end, and why it ended. A row's id is derived from what it
-- describes, so recording it again (a replayed event, a replica received
-- twice) changes nothing.

-- This region's name, for rows written by triggers (set at every start).
CREATE TABLE region_meta (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    name     text    NOT NULL
);

-- Why a preemption in flight was asked for (`priority`, `reclaim`, `grow`,
-- `defrag`, `reservation`, `drain`, `maintenance`, `repair`, `health`,
-- `fenced`, `evacuating`, `failing_back`, `operator`): the ledger says
-- who caused the interval's end.
ALTER TABLE jobs ADD COLUMN preempt_cause text;

CREATE TABLE usage_ledger (
    usage_id        uuid             PRIMARY KEY,
    job_id          uuid             NOT NULL,
    epoch           integer          NOT NULL,
    attempt         integer          NOT NULL,
    rank            integer          NOT NULL,
    tenant          text             NOT NULL,
    -- The region that ran it (a buddy also holds its peers' rows).
    region          text             NOT NULL,
    gpu_type        text             NOT NULL,
    priority        smallint         NOT NULL,
    gpus            integer          NOT NULL CHECK (gpus > 0),
    started_at      timestamptz      NOT NULL,
    ended_at        timestamptz      NOT NULL CHECK (ended_at >= started_at),
    gpu_seconds     double precision NOT NULL CHECK (gpu_seconds >= 0),
    -- How the placement ended: succeeded, failed, cancelled, preempted,
    -- node_lost.
    ended_by        text             NOT NULL,
    -- For a preempted or lost placement, what caused it (see preempt_cause).
    cause           text,
    -- The job's newest checkpoint when it ended: the work after it was lost.
    checkpointed_at timestamptz,
    recorded_at     timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX usage_ledger_by_end ON usage_ledger (ended_at);
CREATE INDEX usage_ledger_by_tenant ON usage_ledger (tenant, ended_at);

-- Rows of this region's jobs its buddy does not hold yet.
CREATE TABLE usage_outbox (
    usage_id uuid PRIMARY KEY REFERENCES usage_ledger (usage_id),
    buddy    text NOT NULL
);

-- A placement (one worker's GPUs on one node, allocated together: one
-- allocated_at) becomes one row per clock hour it held them, so that every
-- row lies within one hour and a month's bill is final once the month is
-- over, even for placements that go on: the meter writes the hours a live
-- placement has completed, the release trigger every hour up to the end.
-- Both derive a row's id from (job, epoch, attempt, rank, start, hour), so
-- an hour written by both is one row. Only hours from `p_since` on are
-- written (the meter looks back a bounded time).
CREATE FUNCTION record_placement(p_job uuid, p_rank integer, p_attempt integer,
                                 p_from timestamptz, p_gpus integer, p_tenant text,
                                 p_gpu_type text, p_until timestamptz, p_ended_by text,
                                 p_since timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH hours AS (
        SELECT greatest(h, p_from) AS s, least(h + interval '1 hour', p_until) AS e,
               h + interval '1 hour' >= p_until AS last, h
        FROM generate_series(date_trunc('hour', greatest(p_from, p_since), 'UTC'), p_until,
                             interval '1 hour') AS h
    ), rows AS (
        INSERT INTO usage_ledger (usage_id, job_id, epoch, attempt, rank, tenant, region,
                                  gpu_type, priority, gpus, started_at, ended_at, gpu_seconds,
                                  ended_by, cause, checkpointed_at)
        SELECT md5(p_job::text || '/' || j.epoch || '/' || p_attempt || '/' || p_rank || '/'
                   || extract(epoch FROM p_from)::text || '/' || extract(epoch FROM hours.h)::text)::uuid,
               p_job, j.epoch, p_attempt, p_rank, p_tenant,
               coalesce((SELECT name FROM region_meta), 'unknown'),
               p_gpu_type, j.priority, p_gpus, hours.s, hours.e,
               p_gpus * extract(epoch FROM hours.e - hours.s)::float8,
               CASE WHEN hours.last AND p_ended_by IS NOT NULL THEN p_ended_by ELSE 'running' END,
               CASE WHEN hours.last AND p_ended_by = 'preempted' THEN j.preempt_cause
                    WHEN hours.last AND p_ended_by = 'node_lost' THEN 'node_lost' END,
               j.checkpointed_at
        FROM hours JOIN jobs j ON j.job_id = p_job
        WHERE hours.e > hours.s
          -- A live placement: only the hours it has completed.
          AND (p_ended_by IS NOT NULL OR hours.h + interval '1 hour' <= p_until)
        ON CONFLICT (usage_id) DO NOTHING
        RETURNING usage_id, job_id
    ), queued AS (
        INSERT INTO usage_outbox (usage_id, buddy)
        SELECT r.usage_id, j.buddy FROM rows r JOIN jobs j USING (job_id)
        WHERE j.buddy IS NOT NULL
    )
    SELECT count(*) INTO n FROM rows;
    RETURN n;
END $$;

-- Placements whose last GPU was just released.
CREATE FUNCTION record_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM record_placement(p.job_id, p.rank, p.attempt, p.allocated_at, p.gpus, p.tenant,
                             p.gpu_type, p.ended_at, p.ended_by, p.allocated_at)
    FROM (
        SELECT a.job_id, a.rank, a.attempt, a.allocated_at,
               min(a.tenant) AS tenant, min(a.gpu_type) AS gpu_type, count(*)::int AS gpus,
               max(a.released_at) AS ended_at, coalesce(min(a.release_reason), 'unknown') AS ended_by
        FROM allocations a
        JOIN (SELECT DISTINCT n.job_id, n.rank, n.attempt, n.allocated_at
              FROM new_rows n JOIN old_rows o USING (alloc_id)
              WHERE o.released_at IS NULL AND n.released_at IS NOT NULL) e
          ON (e.job_id, e.rank, e.attempt, e.allocated_at)
           = (a.job_id, a.rank, a.attempt, a.allocated_at)
        GROUP BY 1, 2, 3, 4
        HAVING bool_and(a.released_at IS NOT NULL)
    ) p;
    RETURN NULL;
END $$;

CREATE TRIGGER allocations_record_usage
    AFTER UPDATE ON allocations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_usage();
