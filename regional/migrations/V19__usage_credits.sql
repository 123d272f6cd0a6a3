-- Credits for GPU time lost to provider-caused events (issue 8,
-- docs/billing.md), and the meter's watermark.
--
-- A placement that ends because of the provider — its node was lost, it
-- was moved off a node (drain, maintenance, repair, health), the region
-- fenced, evacuated or failed back, the job moved to another region, an
-- operator, a reclaim of lent GPUs or the scheduler's own housekeeping
-- preempted it — lost the work since the job's newest checkpoint. That
-- time, from max(placement start, newest checkpoint at its end) to its
-- end, × its GPUs, is not charged: the database writes it as credits, one
-- per hourly usage row it offsets, with an id derived from that row, so a
-- replay changes nothing.

-- The causes whose lost time is credited: this region's policy, read when
-- a placement ends (a change applies to placements that end afterwards).
-- `priority` and `reservation` are not here: they only ever hit the low
-- class, which is priced for being preemptible; their rows still say the
-- cause.
CREATE TABLE usage_credit_causes (
    cause       text PRIMARY KEY,
    description text NOT NULL
);
INSERT INTO usage_credit_causes (cause, description) VALUES
    ('node_lost',    'the node died or stopped answering (or its agent came back with a new boot)'),
    ('drain',        'an operator drained the node'),
    ('maintenance',  'rolling maintenance took the node'),
    ('repair',       'the node went out for repair'),
    ('health',       'the node''s health (a GPU fault) moved the job'),
    ('fenced',       'the region, or the node''s agent, was cut off and stopped the job'),
    ('evacuating',   'the region''s operators evacuated it'),
    ('failing_back', 'the job went back to the region it came from'),
    ('moved',        'another region adopted the job (failover) or took it over'),
    ('operator',     'an operator preempted the job'),
    ('reclaim',      'a tenant took its guaranteed GPUs back from a borrower'),
    ('defrag',       'the scheduler moved the job to defragment the fleet'),
    ('grow',         'the scheduler restarted the elastic job larger');

CREATE TABLE usage_credits (
    -- md5('credit/' || usage_id): one credit per usage row, wherever held.
    credit_id        uuid             PRIMARY KEY,
    -- The usage row (one clock hour of the placement) it offsets, and that
    -- row's start: the credit is priced as of then, like the row.
    usage_id         uuid             NOT NULL,
    usage_started_at timestamptz      NOT NULL,
    job_id           uuid             NOT NULL,
    epoch            integer          NOT NULL,
    attempt          integer          NOT NULL,
    rank             integer          NOT NULL,
    tenant           text             NOT NULL,
    region           text             NOT NULL,
    gpu_type         text             NOT NULL,
    priority         smallint         NOT NULL,
    gpus             integer          NOT NULL CHECK (gpus > 0),
    -- The lost time within the usage row's hour.
    started_at       timestamptz      NOT NULL,
    ended_at         timestamptz      NOT NULL CHECK (ended_at >= started_at),
    gpu_seconds      double precision NOT NULL CHECK (gpu_seconds >= 0),
    -- How the placement ended, and the credited cause.
    ended_by         text             NOT NULL,
    cause            text             NOT NULL,
    checkpointed_at  timestamptz,
    -- When the home wrote it: the billing month it is credited in.
    issued_at        timestamptz      NOT NULL,
    recorded_at      timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX usage_credits_by_end ON usage_credits (ended_at);
CREATE INDEX usage_credits_by_issue ON usage_credits (issued_at);
CREATE INDEX usage_credits_by_tenant ON usage_credits (tenant, ended_at);

-- Credits of this region's jobs their buddy does not hold yet.
CREATE TABLE usage_credit_outbox (
    credit_id uuid PRIMARY KEY REFERENCES usage_credits (credit_id),
    buddy     text NOT NULL
);

-- A placement's rows, for its credits (and a job's usage).
CREATE INDEX usage_ledger_by_job ON usage_ledger (job_id, started_at);

-- Every live placement has its rows for every clock hour before this
-- (written by the meter in the transaction that moved it): what the
-- tenant API counts as not metered yet, and where reconciliation clips
-- live placements. NULL: not metered since V19.
ALTER TABLE region_meta ADD COLUMN metered_until timestamptz;

-- V18's function, and then the credits of a placement that ended with a
-- credited cause.
CREATE OR REPLACE FUNCTION record_placement(p_job uuid, p_rank integer, p_attempt integer,
                                            p_from timestamptz, p_gpus integer, p_tenant text,
                                            p_gpu_type text, p_until timestamptz, p_ended_by text,
                                            p_since timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    v_region text := coalesce((SELECT name FROM region_meta), 'unknown');
    v_cause text;
    v_lost_from timestamptz;
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
               p_job, j.epoch, p_attempt, p_rank, p_tenant, v_region,
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

    IF p_ended_by IS NULL THEN
        RETURN n;
    END IF;
    -- What ended it, and the work lost: since the newest checkpoint, or
    -- the whole placement when that is older than its start.
    SELECT CASE p_ended_by WHEN 'node_lost' THEN 'node_lost'
                           WHEN 'moved' THEN 'moved'
                           WHEN 'preempted' THEN j.preempt_cause END,
           least(greatest(p_from, coalesce(j.checkpointed_at, p_from)), p_until)
      INTO v_cause, v_lost_from
      FROM jobs j WHERE j.job_id = p_job;
    IF v_cause IS NULL OR v_lost_from >= p_until
       OR NOT EXISTS (SELECT 1 FROM usage_credit_causes c WHERE c.cause = v_cause) THEN
        RETURN n;
    END IF;
    -- One credit per usage row of the placement (this statement sees the
    -- rows just written and those the meter wrote before) for its part
    -- after the checkpoint: never more than the row charges.
    WITH credits AS (
        INSERT INTO usage_credits (credit_id, usage_id, usage_started_at, job_id, epoch,
                                   attempt, rank, tenant, region, gpu_type, priority, gpus,
                                   started_at, ended_at, gpu_seconds, ended_by, cause,
                                   checkpointed_at, issued_at)
        SELECT md5('credit/' || u.usage_id::text)::uuid, u.usage_id, u.started_at, u.job_id,
               u.epoch, u.attempt, u.rank, u.tenant, u.region, u.gpu_type, u.priority, u.gpus,
               greatest(u.started_at, v_lost_from), u.ended_at,
               u.gpus * extract(epoch FROM u.ended_at - greatest(u.started_at, v_lost_from))::float8,
               p_ended_by, v_cause, j.checkpointed_at, now()
        FROM usage_ledger u JOIN jobs j ON j.job_id = u.job_id
        WHERE u.job_id = p_job AND u.rank = p_rank AND u.attempt = p_attempt
          AND u.region = v_region
          AND u.started_at >= p_from AND u.started_at < p_until
          AND u.ended_at > v_lost_from
        ON CONFLICT (credit_id) DO NOTHING
        RETURNING credit_id, job_id
    )
    INSERT INTO usage_credit_outbox (credit_id, buddy)
    SELECT c.credit_id, j.buddy FROM credits c JOIN jobs j USING (job_id)
    WHERE j.buddy IS NOT NULL;
    RETURN n;
END $$;
