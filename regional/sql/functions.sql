-- The live body of every SQL function of the regional schema, one place
-- each (issue 20). `Store::migrate` applies this file after the versioned
-- migrations, under the same lock, every time a replica starts: each
-- statement is `CREATE OR REPLACE`, so applying it again changes nothing,
-- and changing a function means editing it here (never restating it in a
-- new migration: `regional/tests/functions.rs` refuses that). Triggers that
-- call these functions, and the tables they read, stay in the migrations;
-- a migration must not call a function first written here (on a fresh
-- database every migration runs before this file). A trigger whose
-- function was first written here (after V25) is created here, after its
-- function, with `CREATE OR REPLACE TRIGGER` (at the end of the file).
--
-- Each function first appeared in the migration named above it.

-- audit_log_append_only (since V4__fleet_ops.sql; this body from V4__fleet_ops.sql)
-- Append-only in the database too, whatever the code does.
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END
$$;

-- jobs_buddy_dirty (since V16__replication.sql; this body from V16__replication.sql)
-- A job with a buddy that ends, or gets a new checkpoint, is dirty until
-- the buddy is told (other state changes do not matter to it).
CREATE OR REPLACE FUNCTION jobs_buddy_dirty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.buddy IS NOT NULL AND NEW.buddy_dirty_since IS NULL
       AND ((NEW.state IN ('succeeded', 'failed', 'cancelled')
             AND NEW.state::text IS DISTINCT FROM NEW.buddy_told_state)
            OR NEW.restore_from IS DISTINCT FROM NEW.buddy_told_checkpoint) THEN
        NEW.buddy_dirty_since := now();
    END IF;
    RETURN NEW;
END $$;

-- record_usage (since V18__usage_ledger.sql; this body from V18__usage_ledger.sql)
-- Placements whose last GPU was just released.
CREATE OR REPLACE FUNCTION record_usage() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- record_placement (since V18__usage_ledger.sql; this body from V20__usage_corrections_and_commitments.sql)
-- V19's function, with (a) the rows' commitment (the job's reservation or
-- cluster), (b) corrections of the rows that reach past a released
-- placement's end, and (c) credits clipped to that end. The job's buddy,
-- which the outboxes name, is read once by key: as a join of the rows
-- written with `jobs` the planner (statistics of a few hundred jobs)
-- hashed the whole table for every ended placement, 3–5 ms each at
-- 10,000 jobs and growing with them (session 21).
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
    v_buddy text := (SELECT buddy FROM jobs WHERE job_id = p_job);
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
        SELECT r.usage_id, v_buddy FROM rows r WHERE v_buddy IS NOT NULL
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
        RETURNING credit_id
    )
    INSERT INTO usage_credit_outbox (credit_id, buddy)
    SELECT c.credit_id, v_buddy FROM corrections c WHERE v_buddy IS NOT NULL;

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
        RETURNING credit_id
    )
    INSERT INTO usage_credit_outbox (credit_id, buddy)
    SELECT c.credit_id, v_buddy FROM credits c WHERE v_buddy IS NOT NULL;
    RETURN n;
END $$;

-- quotas_commitment (since V20__usage_corrections_and_commitments.sql; this body from V20__usage_corrections_and_commitments.sql)
-- A guaranteed quota: its guaranteed GPUs, while it exists.
CREATE OR REPLACE FUNCTION quotas_commitment() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- reservations_commitment (since V20__usage_corrections_and_commitments.sql; this body from V20__usage_corrections_and_commitments.sql)
-- A capacity reservation: its GPUs over its window, while it is not
-- deleted (a resize opens a new version; the end of its window ends it).
CREATE OR REPLACE FUNCTION reservations_commitment() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- gpus_per_node (since V20__usage_corrections_and_commitments.sql; this body from V20__usage_corrections_and_commitments.sql)
-- GPUs of one node of a type in this region (the most any has).
CREATE OR REPLACE FUNCTION gpus_per_node(p_gpu_type text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(c), 0)::integer FROM (
        SELECT count(*) AS c FROM gpus g JOIN nodes n USING (node_id)
        WHERE n.gpu_type = p_gpu_type GROUP BY g.node_id) per_node
$$;

-- clusters_commitment (since V20__usage_corrections_and_commitments.sql; this body from V20__usage_corrections_and_commitments.sql)
-- A dedicated cluster: the nodes it asks for × GPUs per node, from its
-- creation until its nodes are given back (`deleted`).
CREATE OR REPLACE FUNCTION clusters_commitment() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- queue_opened_placements (since V22__placement_replicas_and_closings.sql; this body from V22__placement_replicas_and_closings.sql)
CREATE OR REPLACE FUNCTION queue_opened_placements() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO placement_outbox (job_id, rank, attempt, allocated_at, buddy)
    SELECT DISTINCT n.job_id, n.rank, n.attempt, n.allocated_at, j.buddy
    FROM new_rows n JOIN jobs j ON j.job_id = n.job_id
    WHERE j.buddy IS NOT NULL
    ON CONFLICT (job_id, rank, attempt, allocated_at)
    DO UPDATE SET seq = nextval('placement_outbox_seq'), buddy = EXCLUDED.buddy,
                  queued_at = now();
    RETURN NULL;
END $$;

-- queue_ended_placements (since V22__placement_replicas_and_closings.sql; this body from V22__placement_replicas_and_closings.sql)
CREATE OR REPLACE FUNCTION queue_ended_placements() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO placement_outbox (job_id, rank, attempt, allocated_at, buddy)
    SELECT DISTINCT n.job_id, n.rank, n.attempt, n.allocated_at, j.buddy
    FROM new_rows n JOIN old_rows o USING (alloc_id) JOIN jobs j ON j.job_id = n.job_id
    WHERE j.buddy IS NOT NULL AND o.released_at IS NULL AND n.released_at IS NOT NULL
    ON CONFLICT (job_id, rank, attempt, allocated_at)
    DO UPDATE SET seq = nextval('placement_outbox_seq'), buddy = EXCLUDED.buddy,
                  queued_at = now();
    RETURN NULL;
END $$;

-- close_placements (since V22__placement_replicas_and_closings.sql; this body from V22__placement_replicas_and_closings.sql)
-- The adopter's closing of the home's placements of job `p_job` at the
-- home's epoch `p_epoch` that it holds as open (docs/billing.md, "A region
-- that does not come back"): each from the end of the newest ledger row
-- held of it (the home's meter's, replicated; or its start) to the last
-- time this region heard from the home (or was told of the placement, if
-- later), one `usage_closings` row per clock hour, the last `ended_by`
-- `moved`. The work after `p_checkpointed_at` — the checkpoint the job
-- resumes from here; NULL: it starts over, the whole placement is lost —
-- is credited (cause `moved`, when that cause is credited), on the held
-- rows and the closings. Each placement is closed once (`closed_at`); the
-- ids are derived from what they describe. Returns how many hours were
-- closed.
CREATE OR REPLACE FUNCTION close_placements(p_job uuid, p_home text, p_epoch integer,
                                 p_checkpointed_at timestamptz, p_me text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    p record;
    v_heard timestamptz := (SELECT last_heard_at FROM peer_leases WHERE peer = p_home);
    v_key text;
    v_from timestamptz;
    v_until timestamptz;
    v_lost timestamptz;
    n integer := 0;
    k integer;
BEGIN
    FOR p IN SELECT * FROM replica_placements
             WHERE job_id = p_job AND home = p_home AND epoch = p_epoch
               AND ended_at IS NULL AND closed_at IS NULL
             ORDER BY rank, attempt, started_at
             FOR UPDATE
    LOOP
        -- A row of the placement, as record_placement derives its id.
        v_key := p.job_id::text || '/' || p.epoch || '/' || p.attempt || '/' || p.rank || '/'
                 || extract(epoch FROM p.started_at)::text || '/';
        SELECT max(l.ended_at) INTO v_from FROM usage_ledger l
        WHERE l.job_id = p.job_id AND l.rank = p.rank AND l.attempt = p.attempt
          AND l.region = p_home AND l.started_at >= p.started_at
          AND l.usage_id = md5(v_key || extract(epoch FROM date_trunc('hour', l.started_at, 'UTC'))::text)::uuid;
        v_from := greatest(p.started_at, coalesce(v_from, p.started_at));
        v_until := greatest(p.started_at, p.told_at, coalesce(v_heard, p.told_at));
        IF v_until > v_from THEN
            INSERT INTO usage_closings (usage_id, job_id, epoch, attempt, rank, tenant, region,
                                        gpu_type, priority, gpus, started_at, ended_at,
                                        gpu_seconds, ended_by, cause, checkpointed_at,
                                        reservation_id, cluster_id, closed_by)
            SELECT md5('closing/' || v_key || extract(epoch FROM h.h)::text)::uuid,
                   p.job_id, p.epoch, p.attempt, p.rank, p.tenant, p_home, p.gpu_type,
                   p.priority, p.gpus, h.s, h.e, p.gpus * extract(epoch FROM h.e - h.s)::float8,
                   CASE WHEN h.last THEN 'moved' ELSE 'running' END,
                   CASE WHEN h.last THEN 'moved' END,
                   p_checkpointed_at, p.reservation_id, p.cluster_id, p_me
            FROM (SELECT x AS h, greatest(x, v_from) AS s,
                         least(x + interval '1 hour', v_until) AS e,
                         x + interval '1 hour' >= v_until AS last
                  FROM generate_series(date_trunc('hour', v_from, 'UTC'), v_until,
                                       interval '1 hour') AS x) h
            WHERE h.e > h.s
            ON CONFLICT (usage_id) DO NOTHING;
            GET DIAGNOSTICS k = ROW_COUNT;
            n := n + k;
        END IF;
        v_lost := least(greatest(p.started_at, coalesce(p_checkpointed_at, p.started_at)), v_until);
        IF v_lost < v_until
           AND EXISTS (SELECT 1 FROM usage_credit_causes c WHERE c.cause = 'moved') THEN
            INSERT INTO usage_closing_credits (credit_id, usage_id, usage_started_at, job_id,
                                               epoch, attempt, rank, tenant, region, gpu_type,
                                               priority, gpus, started_at, ended_at,
                                               gpu_seconds, ended_by, cause, checkpointed_at,
                                               issued_at)
            SELECT md5('closing-credit/' || r.usage_id::text)::uuid, r.usage_id, r.started_at,
                   r.job_id, r.epoch, r.attempt, r.rank, r.tenant, r.region, r.gpu_type,
                   r.priority, r.gpus, greatest(r.started_at, v_lost),
                   least(r.ended_at, v_until),
                   r.gpus * extract(epoch FROM least(r.ended_at, v_until)
                                               - greatest(r.started_at, v_lost))::float8,
                   'moved', 'moved', p_checkpointed_at, now()
            FROM (SELECT l.usage_id, l.job_id, l.epoch, l.attempt, l.rank, l.tenant, l.region,
                         l.gpu_type, l.priority, l.gpus, l.started_at, l.ended_at
                  FROM usage_ledger l
                  WHERE l.job_id = p.job_id AND l.rank = p.rank AND l.attempt = p.attempt
                    AND l.region = p_home AND l.started_at >= p.started_at
                    AND l.usage_id = md5(v_key || extract(epoch FROM date_trunc('hour', l.started_at, 'UTC'))::text)::uuid
                  UNION ALL
                  SELECT c.usage_id, c.job_id, c.epoch, c.attempt, c.rank, c.tenant, c.region,
                         c.gpu_type, c.priority, c.gpus, c.started_at, c.ended_at
                  FROM usage_closings c
                  WHERE c.job_id = p.job_id AND c.rank = p.rank AND c.attempt = p.attempt
                    AND c.region = p_home AND c.started_at >= p.started_at
                    AND c.usage_id = md5('closing/' || v_key || extract(epoch FROM date_trunc('hour', c.started_at, 'UTC'))::text)::uuid) r
            WHERE least(r.ended_at, v_until) > greatest(r.started_at, v_lost)
            ON CONFLICT (credit_id) DO NOTHING;
        END IF;
        UPDATE replica_placements SET closed_at = v_until
        WHERE (job_id, epoch, attempt, rank, started_at)
            = (p.job_id, p.epoch, p.attempt, p.rank, p.started_at);
    END LOOP;
    RETURN n;
END $$;

-- commitment_changed (since V22__placement_replicas_and_closings.sql; this body from V22__placement_replicas_and_closings.sql)
CREATE OR REPLACE FUNCTION commitment_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.change_seq := nextval('commitment_change_seq');
    NEW.change_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

-- record_commitment (since V20__usage_corrections_and_commitments.sql; this body from V22__placement_replicas_and_closings.sql)
-- V20's function, but a version closed in the transaction that opened it
-- is kept (of no length: it commits nothing) rather than deleted, so that
-- what a peer was sent is only ever superseded, never withdrawn.
CREATE OR REPLACE FUNCTION record_commitment(p_kind text, p_id text, p_tenant text,
                                             p_gpu_type text, p_gpus integer,
                                             p_start timestamptz, p_end timestamptz,
                                             p_live boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz;
BEGIN
    SELECT greatest(now(), max(valid_from)) INTO v_at FROM commitment_history
    WHERE kind = p_kind AND commitment_id = p_id AND valid_until IS NULL;
    UPDATE commitment_history SET valid_until = v_at
    WHERE kind = p_kind AND commitment_id = p_id AND valid_until IS NULL;
    IF p_live AND p_gpus > 0 THEN
        INSERT INTO commitment_history (kind, commitment_id, tenant, gpu_type, gpus,
                                        window_start, window_end, valid_from)
        VALUES (p_kind, p_id, p_tenant, p_gpu_type, p_gpus, p_start, p_end, v_at);
    END IF;
END $$;

-- pool_of (since V26__pool_keys.sql)
-- The scheduling pool a node or job belongs to: its GPU type's shared
-- pool, or its dedicated cluster's (`cluster:<id>`; a GPU type's name
-- never contains `:`). The one place SQL spells the key; Rust's is
-- `store::clusters::pool_key`.
CREATE OR REPLACE FUNCTION pool_of(p_gpu_type text, p_cluster uuid)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_cluster IS NULL THEN p_gpu_type ELSE 'cluster:' || p_cluster::text END
$$;

-- jobs_queue_changed (since V28__queue_changes.sql)
-- What the queue shows of a job changed: its row is found by the next
-- scheduling pass's read of what changed (`store/queue.rs`).
CREATE OR REPLACE FUNCTION jobs_queue_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.queue_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

-- workers_queue_changed (since V28__queue_changes.sql)
-- Workers started or ceased to wait: their jobs' queue entries changed (an
-- array job's workers are placed one by one while the job's row may stay
-- as it is). Once per statement: as a row trigger it was a call and a
-- statement per placed worker (0.2 ms each, a tenth of a placing commit).
-- The jobs are found by key (`= ANY` of an array), whatever the planner
-- would estimate for the transition tables: the plan is made once per
-- connection, and a join planned on a large statement's rows would scan
-- `jobs` for every small one after.
CREATE OR REPLACE FUNCTION workers_queue_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET queue_xid = pg_current_xact_id()
    WHERE job_id = ANY (ARRAY(
            SELECT DISTINCT n.job_id
            FROM new_rows n JOIN old_rows o ON o.job_id = n.job_id AND o.rank = n.rank
            WHERE (o.state = 'pending') IS DISTINCT FROM (n.state = 'pending')))
      AND queue_xid <> pg_current_xact_id();
    RETURN NULL;
END $$;

-- jobs_deleted (since V28__queue_changes.sql)
-- A deleted job leaves no row for a pass to find: the next pass reads the
-- whole queue.
CREATE OR REPLACE FUNCTION jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sched_state SET queue_epoch = queue_epoch + 1 WHERE id = 1;
    RETURN NULL;
END $$;

-- The triggers of the functions first written here (V28__queue_changes.sql
-- says why each column matters).
CREATE OR REPLACE TRIGGER jobs_queue_changed BEFORE UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
       OR OLD.run_workers IS DISTINCT FROM NEW.run_workers
       OR OLD.handover_to IS DISTINCT FROM NEW.handover_to
       OR OLD.cluster_id IS DISTINCT FROM NEW.cluster_id
       OR OLD.gpu_type IS DISTINCT FROM NEW.gpu_type
       OR OLD.tenant IS DISTINCT FROM NEW.tenant
       OR OLD.priority IS DISTINCT FROM NEW.priority
       OR OLD.seq IS DISTINCT FROM NEW.seq
       OR OLD.requeue_front IS DISTINCT FROM NEW.requeue_front
       OR OLD.mode IS DISTINCT FROM NEW.mode
       OR OLD.gpus_per_worker IS DISTINCT FROM NEW.gpus_per_worker
       OR OLD.required_level IS DISTINCT FROM NEW.required_level
       OR OLD.preferred_level IS DISTINCT FROM NEW.preferred_level
       OR OLD.created_at IS DISTINCT FROM NEW.created_at
       OR OLD.estimated_duration_s IS DISTINCT FROM NEW.estimated_duration_s
       OR OLD.min_workers IS DISTINCT FROM NEW.min_workers
       OR OLD.reservation_id IS DISTINCT FROM NEW.reservation_id)
    EXECUTE FUNCTION jobs_queue_changed();
-- (Transition tables rule out `UPDATE OF state`; every update of workers
-- changes its state anyway.)
CREATE OR REPLACE TRIGGER workers_queue_changed AFTER UPDATE ON workers
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION workers_queue_changed();
CREATE OR REPLACE TRIGGER jobs_deleted AFTER DELETE ON jobs FOR EACH STATEMENT
    EXECUTE FUNCTION jobs_deleted();
