-- A dead region's last placements (issue 8, docs/billing.md, "A region
-- that does not come back").
--
-- The meter writes a live placement's completed hours; the release writes
-- the rest. A region that dies for good never releases its last
-- placements, so the time from its last metered hour to its death was in
-- no ledger. Now:
--
-- 1. A home tells its job's buddy of every placement as it opens and ends
--    (`placement_outbox` here; `replica_placements` at the buddy), next to
--    the job's intent.
-- 2. The buddy, adopting the job, **closes** the home's placements it holds
--    as still open: from the end of the newest ledger row it holds of each
--    (or its start) to the last time it heard from the home, per clock
--    hour (`usage_closings`), with credits for the work after the
--    checkpoint the job resumed from (`usage_closing_credits`).
--
-- Closings are the region's estimate of a home's hours it never heard of,
-- so they count only where the home is read from its copies (it does not
-- answer: the tenant API's copies, `gangway billing export --from-copies`):
-- a home that answers bills its own placements from its own ledger. They
-- are kept apart from the ledger and the credits so that they can never be
-- confused with a row the home writes itself.

-- The home's side: placements of jobs with a buddy whose opening or end
-- the buddy has not been told yet. What is sent is read from `allocations`
-- when it is sent; a placement that changes again is queued again (`seq`).
CREATE SEQUENCE placement_outbox_seq;
CREATE TABLE placement_outbox (
    job_id       uuid        NOT NULL,
    rank         integer     NOT NULL,
    attempt      integer     NOT NULL,
    allocated_at timestamptz NOT NULL,
    buddy        text        NOT NULL,
    seq          bigint      NOT NULL DEFAULT nextval('placement_outbox_seq'),
    queued_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, rank, attempt, allocated_at)
);

CREATE FUNCTION queue_opened_placements() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE FUNCTION queue_ended_placements() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER allocations_queue_opened
    AFTER INSERT ON allocations
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queue_opened_placements();
CREATE TRIGGER allocations_queue_ended
    AFTER UPDATE ON allocations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queue_ended_placements();

-- The buddy's side: a peer's open placements of the jobs whose intent it
-- holds (one the home says ended is dropped, unless closed already).
CREATE TABLE replica_placements (
    job_id         uuid        NOT NULL,
    epoch          integer     NOT NULL,
    attempt        integer     NOT NULL,
    rank           integer     NOT NULL,
    started_at     timestamptz NOT NULL,
    home           text        NOT NULL,
    tenant         text        NOT NULL,
    gpu_type       text        NOT NULL,
    priority       smallint    NOT NULL,
    gpus           integer     NOT NULL CHECK (gpus > 0),
    reservation_id uuid,
    cluster_id     uuid,
    -- Kept for a placement closed here (NULL: open at the home).
    ended_at       timestamptz,
    -- When the home last told of it (on this region's clock).
    told_at        timestamptz NOT NULL DEFAULT now(),
    -- Closed by this region, as its adopter, up to then (`close_placements`).
    closed_at      timestamptz,
    PRIMARY KEY (job_id, epoch, attempt, rank, started_at)
);
CREATE INDEX replica_placements_open ON replica_placements (job_id) WHERE ended_at IS NULL;

-- The newest checkpoint's time as the home told it (with its key): where
-- the work an adopted job lost begins.
ALTER TABLE replica_jobs ADD COLUMN checkpointed_at timestamptz;

-- Hours of a home's placements its adopter closed: shaped like ledger
-- rows (`region` the home), ids from 'closing/' and the row's key.
CREATE TABLE usage_closings (LIKE usage_ledger INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE usage_closings ADD PRIMARY KEY (usage_id);
-- When the adopter closed them, and the region that did.
ALTER TABLE usage_closings ADD COLUMN closed_by text NOT NULL DEFAULT '';
CREATE INDEX usage_closings_by_end ON usage_closings (region, ended_at);

-- Credits of the work a closed placement lost: of its closings and of the
-- ledger rows held for it after the checkpoint it resumed from; ids from
-- 'closing-credit/' and the row's id.
CREATE TABLE usage_closing_credits (LIKE usage_credits INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE usage_closing_credits ADD PRIMARY KEY (credit_id);
CREATE INDEX usage_closing_credits_by_end ON usage_closing_credits (region, ended_at);

-- What the outbox reads a placement from (a released one too).
CREATE INDEX allocations_by_placement ON allocations (job_id, rank, attempt, allocated_at);

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
CREATE FUNCTION close_placements(p_job uuid, p_home text, p_epoch integer,
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

-- Committed capacity, replicated to every peer (small: a version per
-- change), so that a region that never comes back is billed its
-- commitments from its copies too. Every version records its last change:
-- `change_seq`, taken under the row's lock (so a later change of a version
-- has a larger number: what a peer keeps), and the changing transaction
-- (`change_xid`). Each peer is sent the versions changed by transactions
-- from where it was last sent (`commitment_peers`) to the oldest one
-- running now (the snapshot's xmin): a change is sent once its
-- transaction is over, whatever order transactions commit in.
CREATE SEQUENCE commitment_change_seq;
ALTER TABLE commitment_history
    ADD COLUMN change_seq bigint,
    ADD COLUMN change_xid xid8 NOT NULL DEFAULT pg_current_xact_id();
UPDATE commitment_history SET change_seq = nextval('commitment_change_seq');
ALTER TABLE commitment_history
    ALTER COLUMN change_seq SET DEFAULT nextval('commitment_change_seq'),
    ALTER COLUMN change_seq SET NOT NULL;
CREATE INDEX commitment_history_by_change ON commitment_history (change_xid, change_seq);

CREATE FUNCTION commitment_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.change_seq := nextval('commitment_change_seq');
    NEW.change_xid := pg_current_xact_id();
    RETURN NEW;
END $$;
CREATE TRIGGER commitment_history_changed BEFORE UPDATE ON commitment_history
    FOR EACH ROW EXECUTE FUNCTION commitment_changed();

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

-- Per peer, where the next sending starts: every change before
-- (`sent_xid`, `sent_seq`) in (transaction, change) order is held there.
CREATE TABLE commitment_peers (
    peer     text   PRIMARY KEY,
    sent_xid xid8   NOT NULL,
    sent_seq bigint NOT NULL
);

-- Peers' commitment versions, as they sent them.
CREATE TABLE held_commitments (
    home          text        NOT NULL,
    version_id    bigint      NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('guarantee', 'reservation', 'cluster')),
    commitment_id text        NOT NULL,
    tenant        text        NOT NULL,
    gpu_type      text        NOT NULL,
    gpus          integer     NOT NULL CHECK (gpus > 0),
    window_start  timestamptz,
    window_end    timestamptz,
    valid_from    timestamptz NOT NULL,
    valid_until   timestamptz CHECK (valid_until >= valid_from),
    change_seq    bigint      NOT NULL,
    PRIMARY KEY (home, version_id)
);
