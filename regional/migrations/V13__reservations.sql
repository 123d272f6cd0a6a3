-- Gangway regional schema, version 13: capacity reservations. A tenant
-- reserves GPUs of a type inside one domain of a topology level for a
-- window; the region admits a reservation only if it can keep every
-- promise it made (src/store/reservations.rs), and jobs may name one to
-- run in it. What is persisted here and why is described in
-- src/store/mod.rs.

CREATE TABLE capacity_reservations (
    reservation_id  uuid           PRIMARY KEY,
    tenant          text           NOT NULL,
    -- A keyed create's id is derived from (tenant, key); the key is kept to
    -- tell a retry from a reuse of the key for another reservation.
    idempotency_key text,
    gpu_type        text           NOT NULL,
    gpus            integer        NOT NULL CHECK (gpus > 0),
    level           topology_level NOT NULL,
    -- The domain admission pinned it to, from the region down: [spine],
    -- [spine, leaf] or [spine, leaf, nvlink domain]; empty for the region.
    path            text[]         NOT NULL,
    start_at        timestamptz    NOT NULL,
    -- NULL: open-ended.
    end_at          timestamptz    CHECK (end_at > start_at),
    state           text           NOT NULL DEFAULT 'active'
                                   CHECK (state IN ('active', 'deleted')),
    -- The create as accepted, compared on retries with the same key.
    request         jsonb          NOT NULL,
    created_at      timestamptz    NOT NULL DEFAULT now(),
    updated_at      timestamptz    NOT NULL DEFAULT now(),
    UNIQUE (tenant, idempotency_key),
    CHECK (cardinality(path) = CASE level WHEN 'region' THEN 0 WHEN 'spine' THEN 1
                                          WHEN 'leaf' THEN 2 ELSE 3 END)
);

-- What admission and the snapshot read: a type's reservations not deleted.
CREATE INDEX capacity_reservations_live ON capacity_reservations (gpu_type, start_at)
    WHERE state = 'active';
-- A tenant's reservations, newest first.
CREATE INDEX capacity_reservations_by_tenant ON capacity_reservations (tenant, created_at);

-- Keyed resizes and deletes: the key, what it did and to which
-- reservation, so a retry is answered without doing it again and a key
-- reused for something else is refused.
CREATE TABLE reservation_requests (
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL,
    reservation_id  uuid        NOT NULL REFERENCES capacity_reservations,
    op              text        NOT NULL CHECK (op IN ('resize', 'delete')),
    request         jsonb       NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, idempotency_key)
);

-- The reservation a job runs in (NULL: ordinary work).
ALTER TABLE jobs ADD COLUMN reservation_id uuid REFERENCES capacity_reservations;
CREATE INDEX jobs_by_reservation ON jobs (reservation_id) WHERE reservation_id IS NOT NULL;
