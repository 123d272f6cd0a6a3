-- Gangway regional schema, version 16: regions watch each other and hold
-- each other's job intent (docs/failover.md). What is persisted here and
-- why is described in src/store/mod.rs; the protocol in src/peers.rs and
-- src/store/replicas.rs.

-- Per peer region: the last successful round trip of our heartbeat to it
-- (fencing counts these), the last heartbeat we received from it (adoption
-- counts silences), and what it last told us of every region (seconds
-- since it heard from each). On the database's clock, so every replica of
-- this region sees the same.
CREATE TABLE peer_leases (
    peer          text        PRIMARY KEY,
    last_ok_at    timestamptz,
    last_heard_at timestamptz,
    silent_s      jsonb       NOT NULL DEFAULT '{}',
    silent_at     timestamptz
);

-- Other regions' jobs whose intent this region holds as their buddy: what
-- the tenant asked (the accepted spec, verbatim), the home's ownership
-- epoch, and how it stands: `live` (the home runs it), `finished` (the
-- home said it ended: never adopted), `adopted` (this region took it over
-- at a higher epoch; `jobs` has it now).
CREATE TABLE replica_jobs (
    job_id          uuid        PRIMARY KEY,
    home            text        NOT NULL,
    tenant          text        NOT NULL,
    idempotency_key text,
    spec            jsonb       NOT NULL,
    created_at      timestamptz NOT NULL,
    epoch           integer     NOT NULL CHECK (epoch > 0),
    state           text        NOT NULL DEFAULT 'live'
                                CHECK (state IN ('live', 'finished', 'adopted')),
    -- The newest checkpoint the home told us of (its store key).
    checkpoint      text,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX replica_jobs_live ON replica_jobs (home) WHERE state = 'live';

-- Jobs adopted by a region other than their home, as the adopter recorded
-- them at a majority of regions before starting them: a home that comes
-- back learns here (from any region of its new majority) which of its jobs
-- moved, and releases them.
CREATE TABLE job_moves (
    job_id     uuid        PRIMARY KEY,
    from_home  text        NOT NULL,
    to_region  text        NOT NULL,
    epoch      integer     NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_moves_by_home ON job_moves (from_home);

-- Our jobs' side. `awaits_buddy`: created, its intent not yet held by a
-- buddy; it is neither acknowledged nor scheduled until it is. `buddy`:
-- the region holding its intent. `buddy_told_state` /
-- `buddy_told_checkpoint`: what the buddy was last told of it, and
-- `buddy_dirty_since`: when it first differed from what the buddy holds
-- (the replication lag). `adopted_from`: the region it was adopted from.
-- `moved_to`: the region that adopted it (this copy is then cancelled).
-- The ownership epoch (also the checkpoint store's; docs/failover.md).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS epoch integer NOT NULL DEFAULT 1;

ALTER TABLE jobs
    ADD COLUMN awaits_buddy          boolean NOT NULL DEFAULT false,
    ADD COLUMN buddy                 text,
    ADD COLUMN buddy_told_state      text,
    ADD COLUMN buddy_told_checkpoint text,
    ADD COLUMN buddy_dirty_since     timestamptz,
    ADD COLUMN adopted_from          text,
    ADD COLUMN moved_to              text;
CREATE INDEX jobs_awaiting_buddy ON jobs (created_at) WHERE awaits_buddy;
CREATE INDEX jobs_buddy_dirty ON jobs (buddy_dirty_since) WHERE buddy_dirty_since IS NOT NULL;

-- A job with a buddy that ends, or gets a new checkpoint, is dirty until
-- the buddy is told (other state changes do not matter to it).
CREATE FUNCTION jobs_buddy_dirty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.buddy IS NOT NULL AND NEW.buddy_dirty_since IS NULL
       AND ((NEW.state IN ('succeeded', 'failed', 'cancelled')
             AND NEW.state::text IS DISTINCT FROM NEW.buddy_told_state)
            OR NEW.restore_from IS DISTINCT FROM NEW.buddy_told_checkpoint) THEN
        NEW.buddy_dirty_since := now();
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER jobs_buddy_dirty BEFORE UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_buddy_dirty();
