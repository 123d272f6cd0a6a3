-- Gangway regional schema, version 14: dedicated clusters. A tenant's
-- cluster is a set of whole nodes bound to it, inside one domain of a
-- topology level; only its jobs run there and they run nowhere else. What
-- is persisted here and why is described in src/store/mod.rs; how the
-- cluster is created, healed, resized and deleted in src/store/clusters.rs.

CREATE TABLE clusters (
    cluster_id      uuid           PRIMARY KEY,
    tenant          text           NOT NULL,
    -- A keyed create's id is derived from (tenant, key); the key is kept to
    -- tell a retry from a reuse of the key for another cluster.
    idempotency_key text,
    name            text,
    gpu_type        text           NOT NULL,
    -- Nodes it asks for (its members may be fewer while it is degraded or
    -- more while a shrink gives nodes back).
    nodes           integer        NOT NULL CHECK (nodes > 0),
    level           topology_level NOT NULL,
    -- The domain of `level` its nodes lie in, from the region down, as in
    -- capacity_reservations.path.
    path            text[]         NOT NULL,
    -- 'active' (its state for people is derived from its members),
    -- 'deleting' (its jobs are being stopped, then its nodes unbound),
    -- 'deleted'.
    state           text           NOT NULL DEFAULT 'active'
                                   CHECK (state IN ('active', 'deleting', 'deleted')),
    -- The create as accepted, compared on retries with the same key.
    request         jsonb          NOT NULL,
    created_at      timestamptz    NOT NULL DEFAULT now(),
    updated_at      timestamptz    NOT NULL DEFAULT now(),
    UNIQUE (tenant, idempotency_key),
    CHECK (cardinality(path) = CASE level WHEN 'region' THEN 0 WHEN 'spine' THEN 1
                                          WHEN 'leaf' THEN 2 ELSE 3 END)
);
CREATE INDEX clusters_by_tenant ON clusters (tenant, created_at);

ALTER TABLE nodes
    -- The cluster the node is bound to (NULL: the shared pool, or a spare).
    ADD COLUMN cluster_id uuid REFERENCES clusters,
    -- Being given back by a shrink: takes no new work of the cluster's;
    -- unbound once its jobs are off.
    ADD COLUMN cluster_release boolean NOT NULL DEFAULT false,
    -- A cluster member is never a spare.
    ADD CONSTRAINT cluster_member_not_spare CHECK (cluster_id IS NULL OR NOT spare);
CREATE INDEX nodes_by_cluster ON nodes (cluster_id) WHERE cluster_id IS NOT NULL;

-- The cluster a job runs on (NULL: the shared pool).
ALTER TABLE jobs ADD COLUMN cluster_id uuid REFERENCES clusters;
CREATE INDEX jobs_by_cluster ON jobs (cluster_id) WHERE cluster_id IS NOT NULL;

-- Keyed resizes and deletes, as reservation_requests.
CREATE TABLE cluster_requests (
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL,
    cluster_id      uuid        NOT NULL REFERENCES clusters,
    op              text        NOT NULL CHECK (op IN ('resize', 'delete')),
    request         jsonb       NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, idempotency_key)
);

-- The cluster's timeline, which its tenant reads: created, resized, a
-- node lost and a spare swapped in (or none free), deleted.
CREATE TABLE cluster_events (
    id         bigserial   PRIMARY KEY,
    cluster_id uuid        NOT NULL REFERENCES clusters,
    at         timestamptz NOT NULL DEFAULT now(),
    kind       text        NOT NULL CHECK (kind IN
        ('created', 'resized', 'node_failed', 'spare_swapped', 'no_spare', 'node_released',
         'deleting', 'deleted')),
    message    text        NOT NULL,
    details    jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX cluster_events_by_cluster ON cluster_events (cluster_id, id);
