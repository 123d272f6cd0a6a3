-- Corrections of back-dated releases, and committed capacity (issue 8,
-- docs/billing.md).
--
-- 1. A release dated back past hours the meter already wrote whole (an
--    agent back with a new boot: billed to when the old boot was last
--    heard; a worker its fenced agent stopped: to its last sync; a
--    returning home's moved job: to the recorded move) used to keep the
--    meter's longer rows. The ledger stays append-only: the release now
--    writes a **correction** for each row of the placement that reaches
--    past its end — the part after the end, × its GPUs — in
--    `usage_credits` with cause `correction` and
--    `credit_id = md5('correction/' || usage_id)`, replicated like a
--    credit. Credits of such a placement are clipped to its end too.
-- 2. Usage rows say whether they ran inside a commitment: the job's
--    reservation or dedicated cluster (NULL: ordinary work; rows written
--    before V20 are ordinary).
-- 3. `commitment_history`: what each tenant had committed over time —
--    guaranteed quotas, capacity reservations, dedicated clusters — one
--    version per change, written by triggers whatever code path changes
--    them, so a past month bills what held then.

ALTER TABLE usage_ledger
    ADD COLUMN reservation_id uuid,
    ADD COLUMN cluster_id     uuid;

-- Written by the database (record_placement) only; not a cause a region's
-- policy can credit, so never listed in usage_credit_causes.
COMMENT ON COLUMN usage_credits.cause IS
    'a credited cause (usage_credit_causes), or correction: time a back-dated release says the placement did not hold';

-- V19's function, with (a) the rows' commitment (the job's reservation or
-- cluster), (b) corrections of the rows that reach past a released
-- placement's end, and (c) credits clipped to that end.
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
                                  ended_by, cause, checkpointed_at, reservation_id, cluster_id)
        SELECT md5(p_job::text || '/' || j.epoch || '/' || p_attempt || '/' || p_rank || '/'
                   || extract(epoch FROM p_from)::text || '/' || extract(epoch FROM hours.h)::text)::uuid,
               p_job, j.epoch, p_attempt, p_rank, p_tenant, v_region,
               p_gpu_type, j.priority, p_gpus, hours.s, hours.e,
               p_gpus * extract(epoch FROM hours.e - hours.s)::float8,
               CASE WHEN hours.last AND p_ended_by IS NOT NULL THEN p_ended_by ELSE 'running' END,
               CASE WHEN hours.last AND p_ended_by = 'preempted' THEN j.preempt_cause
                    WHEN hours.last AND p_ended_by = 'node_lost' THEN 'node_lost' END,
               j.checkpointed_at, j.reservation_id, j.cluster_id
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

    -- Corrections: this placement's rows (this statement sees the meter's,
    -- committed before — the meter locks the live allocations it meters, so
    -- a release waits for it) that reach past its end, for the part after
    -- it. A row of the placement is recognised by its id (any epoch it was
    -- written under). A replay finds the same rows and writes the same ids.
    WITH corrections AS (
        INSERT INTO usage_credits (credit_id, usage_id, usage_started_at, job_id, epoch,
                                   attempt, rank, tenant, region, gpu_type, priority, gpus,
                                   started_at, ended_at, gpu_seconds, ended_by, cause,
                                   checkpointed_at, issued_at)
        SELECT md5('correction/' || u.usage_id::text)::uuid, u.usage_id, u.started_at,
               u.job_id, u.epoch, u.attempt, u.rank, u.tenant, u.region, u.gpu_type,
               u.priority, u.gpus, greatest(u.started_at, p_until), u.ended_at,
               u.gpus * extract(epoch FROM u.ended_at - greatest(u.started_at, p_until))::float8,
               p_ended_by, 'correction', j.checkpointed_at, now()
        FROM usage_ledger u JOIN jobs j ON j.job_id = u.job_id
        WHERE u.job_id = p_job AND u.rank = p_rank AND u.attempt = p_attempt
          AND u.region = v_region AND u.started_at >= p_from AND u.ended_at > p_until
          AND u.usage_id = md5(p_job::text || '/' || u.epoch || '/' || p_attempt || '/'
                               || p_rank || '/' || extract(epoch FROM p_from)::text || '/'
                               || extract(epoch FROM date_trunc('hour', u.started_at, 'UTC'))::text)::uuid
        ON CONFLICT (credit_id) DO NOTHING
        RETURNING credit_id, job_id
    )
    INSERT INTO usage_credit_outbox (credit_id, buddy)
    SELECT c.credit_id, j.buddy FROM corrections c JOIN jobs j USING (job_id)
    WHERE j.buddy IS NOT NULL;

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
    -- One credit per usage row of the placement for its part after the
    -- checkpoint and before the end (a meter's row may reach past a
    -- back-dated end: that part is corrected, not credited).
    WITH credits AS (
        INSERT INTO usage_credits (credit_id, usage_id, usage_started_at, job_id, epoch,
                                   attempt, rank, tenant, region, gpu_type, priority, gpus,
                                   started_at, ended_at, gpu_seconds, ended_by, cause,
                                   checkpointed_at, issued_at)
        SELECT md5('credit/' || u.usage_id::text)::uuid, u.usage_id, u.started_at, u.job_id,
               u.epoch, u.attempt, u.rank, u.tenant, u.region, u.gpu_type, u.priority, u.gpus,
               greatest(u.started_at, v_lost_from), least(u.ended_at, p_until),
               u.gpus * extract(epoch FROM least(u.ended_at, p_until)
                                           - greatest(u.started_at, v_lost_from))::float8,
               p_ended_by, v_cause, j.checkpointed_at, now()
        FROM usage_ledger u JOIN jobs j ON j.job_id = u.job_id
        WHERE u.job_id = p_job AND u.rank = p_rank AND u.attempt = p_attempt
          AND u.region = v_region
          AND u.started_at >= p_from AND u.started_at < p_until
          AND least(u.ended_at, p_until) > greatest(u.started_at, v_lost_from)
        ON CONFLICT (credit_id) DO NOTHING
        RETURNING credit_id, job_id
    )
    INSERT INTO usage_credit_outbox (credit_id, buddy)
    SELECT c.credit_id, j.buddy FROM credits c JOIN jobs j USING (job_id)
    WHERE j.buddy IS NOT NULL;
    RETURN n;
END $$;

-- Committed capacity over time. One row per version of a commitment: its
-- GPUs (and, for a reservation, its window) from `valid_from` until
-- `valid_until` (NULL: still in force). What was committed at a moment is
-- the version valid then, within its window. Never updated but to close
-- a version, never deleted but a version of no length (two changes in one
-- transaction).
CREATE TABLE commitment_history (
    version_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind          text        NOT NULL CHECK (kind IN ('guarantee', 'reservation', 'cluster')),
    -- The reservation's or cluster's id; `TENANT/GPU_TYPE` for a guarantee.
    commitment_id text        NOT NULL,
    tenant        text        NOT NULL,
    gpu_type      text        NOT NULL,
    -- Guaranteed GPUs; a reservation's GPUs; a cluster's nodes × GPUs per node.
    gpus          integer     NOT NULL CHECK (gpus > 0),
    -- A reservation's window as this version had it (NULL: unbounded).
    window_start  timestamptz,
    window_end    timestamptz,
    valid_from    timestamptz NOT NULL DEFAULT now(),
    valid_until   timestamptz CHECK (valid_until >= valid_from)
);
CREATE UNIQUE INDEX commitment_history_current
    ON commitment_history (kind, commitment_id) WHERE valid_until IS NULL;
CREATE INDEX commitment_history_by_time ON commitment_history (valid_from);

-- Closes the version of a commitment in force, and opens the new one when
-- it still commits GPUs, as of the transaction's time (never before the
-- version it closes began: a transaction that began before the last
-- change and commits after it changes it from then on). The changed row
-- is locked by its own update, so changes of one commitment are serial.
CREATE FUNCTION record_commitment(p_kind text, p_id text, p_tenant text, p_gpu_type text,
                                  p_gpus integer, p_start timestamptz, p_end timestamptz,
                                  p_live boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz;
BEGIN
    SELECT greatest(now(), max(valid_from)) INTO v_at FROM commitment_history
    WHERE kind = p_kind AND commitment_id = p_id AND valid_until IS NULL;
    UPDATE commitment_history SET valid_until = v_at
    WHERE kind = p_kind AND commitment_id = p_id AND valid_until IS NULL;
    DELETE FROM commitment_history
    WHERE kind = p_kind AND commitment_id = p_id AND valid_until = valid_from;
    IF p_live AND p_gpus > 0 THEN
        INSERT INTO commitment_history (kind, commitment_id, tenant, gpu_type, gpus,
                                        window_start, window_end, valid_from)
        VALUES (p_kind, p_id, p_tenant, p_gpu_type, p_gpus, p_start, p_end, v_at);
    END IF;
END $$;

-- A guaranteed quota: its guaranteed GPUs, while it exists.
CREATE FUNCTION quotas_commitment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF TG_OP = 'UPDATE' AND NEW.tenant = OLD.tenant AND NEW.gpu_type = OLD.gpu_type
           AND NEW.guaranteed_gpus = OLD.guaranteed_gpus THEN
            RETURN NEW;
        END IF;
        PERFORM record_commitment('guarantee', OLD.tenant || '/' || OLD.gpu_type, OLD.tenant,
                                  OLD.gpu_type, 0, NULL, NULL, false);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM record_commitment('guarantee', NEW.tenant || '/' || NEW.gpu_type, NEW.tenant,
                                  NEW.gpu_type, NEW.guaranteed_gpus, NULL, NULL, true);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER quotas_commitment_history
    AFTER INSERT OR UPDATE OR DELETE ON quotas
    FOR EACH ROW EXECUTE FUNCTION quotas_commitment();

-- A capacity reservation: its GPUs over its window, while it is not
-- deleted (a resize opens a new version; the end of its window ends it).
CREATE FUNCTION reservations_commitment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.gpus, NEW.start_at, NEW.end_at, NEW.state, NEW.tenant, NEW.gpu_type)
           IS NOT DISTINCT FROM (OLD.gpus, OLD.start_at, OLD.end_at, OLD.state, OLD.tenant,
                                 OLD.gpu_type) THEN
        RETURN NULL;
    END IF;
    PERFORM record_commitment('reservation', NEW.reservation_id::text, NEW.tenant,
                              NEW.gpu_type, NEW.gpus, NEW.start_at, NEW.end_at,
                              NEW.state = 'active');
    RETURN NULL;
END $$;
CREATE TRIGGER reservations_commitment_history
    AFTER INSERT OR UPDATE ON capacity_reservations
    FOR EACH ROW EXECUTE FUNCTION reservations_commitment();

-- GPUs of one node of a type in this region (the most any has).
CREATE FUNCTION gpus_per_node(p_gpu_type text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(c), 0)::integer FROM (
        SELECT count(*) AS c FROM gpus g JOIN nodes n USING (node_id)
        WHERE n.gpu_type = p_gpu_type GROUP BY g.node_id) per_node
$$;

-- A dedicated cluster: the nodes it asks for × GPUs per node, from its
-- creation until its nodes are given back (`deleted`).
CREATE FUNCTION clusters_commitment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.nodes, NEW.state, NEW.tenant, NEW.gpu_type)
           IS NOT DISTINCT FROM (OLD.nodes, OLD.state, OLD.tenant, OLD.gpu_type) THEN
        RETURN NULL;
    END IF;
    PERFORM record_commitment('cluster', NEW.cluster_id::text, NEW.tenant, NEW.gpu_type,
                              NEW.nodes * gpus_per_node(NEW.gpu_type), NULL, NULL,
                              NEW.state <> 'deleted');
    RETURN NULL;
END $$;
CREATE TRIGGER clusters_commitment_history
    AFTER INSERT OR UPDATE ON clusters
    FOR EACH ROW EXECUTE FUNCTION clusters_commitment();

-- What exists already, as well as it is known: reservations and clusters
-- from their creation as they are now (earlier resizes were not kept),
-- until their deletion (their last update); guarantees from now (when
-- they were set was not kept).
INSERT INTO commitment_history (kind, commitment_id, tenant, gpu_type, gpus, window_start,
                                window_end, valid_from, valid_until)
SELECT 'reservation', reservation_id::text, tenant, gpu_type, gpus, start_at, end_at,
       created_at, CASE WHEN state = 'deleted' THEN greatest(updated_at, created_at) END
FROM capacity_reservations;
INSERT INTO commitment_history (kind, commitment_id, tenant, gpu_type, gpus, valid_from,
                                valid_until)
SELECT 'cluster', cluster_id::text, tenant, gpu_type, nodes * gpus_per_node(gpu_type),
       created_at, CASE WHEN state = 'deleted' THEN greatest(updated_at, created_at) END
FROM clusters WHERE nodes * gpus_per_node(gpu_type) > 0;
INSERT INTO commitment_history (kind, commitment_id, tenant, gpu_type, gpus)
SELECT 'guarantee', tenant || '/' || gpu_type, tenant, gpu_type, guaranteed_gpus
FROM quotas WHERE guaranteed_gpus > 0;
