-- Gangway regional schema, version 1.
-- What is persisted here and why is described in src/store/mod.rs.

-- The scheduling generation: every committed plan, and every change to what
-- may be scheduled (a node registered), moves it forward. A plan computed at
-- an older generation is rejected whole.
CREATE TABLE sched_state (
    id             smallint PRIMARY KEY CHECK (id = 1),
    generation     bigint   NOT NULL,
    -- Moves forward whenever the set of nodes or GPUs changes, so replicas
    -- know when their cached view of the fleet's shape is out of date.
    fleet_version  bigint   NOT NULL
);
INSERT INTO sched_state (id, generation, fleet_version) VALUES (1, 0, 0);

CREATE TABLE agents (
    agent_id       text        PRIMARY KEY,
    boot_id        uuid        NOT NULL,
    executor       text        NOT NULL CHECK (executor IN ('real', 'sim')),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    last_sync_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    node_id        text    PRIMARY KEY,
    agent_id       text    NOT NULL REFERENCES agents (agent_id),
    spine          text    NOT NULL,
    leaf           text    NOT NULL,
    nvlink_domain  text    NOT NULL,
    gpu_type       text    NOT NULL,
    address        text    NOT NULL,
    spare          boolean NOT NULL DEFAULT false,
    -- What operators asked for; observed health comes from the agent.
    operator_state text    NOT NULL DEFAULT 'active'
        CHECK (operator_state IN ('active', 'cordoned', 'draining', 'maintenance'))
);
CREATE INDEX nodes_by_agent ON nodes (agent_id);

CREATE TABLE gpus (
    node_id    text    NOT NULL REFERENCES nodes (node_id),
    gpu_index  integer NOT NULL CHECK (gpu_index >= 0),
    uuid       text    NOT NULL,
    PRIMARY KEY (node_id, gpu_index)
);

CREATE TYPE job_state AS ENUM
    ('queued', 'starting', 'running', 'preempting', 'cancelling', 'succeeded', 'failed',
     'cancelled');
CREATE TYPE job_mode AS ENUM ('gang', 'array');
CREATE TYPE worker_state AS ENUM
    ('pending', 'assigned', 'running', 'checkpointing', 'stopping', 'succeeded', 'failed',
     'cancelled');
CREATE TYPE topology_level AS ENUM ('nvlink', 'leaf', 'spine', 'region');

CREATE TABLE jobs (
    job_id               uuid           PRIMARY KEY,
    -- Submission order: the queue's age tie-break and the list cursor.
    seq                  bigint         GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant               text           NOT NULL,
    idempotency_key      text,
    -- The spec exactly as accepted: returned to the tenant, and compared
    -- with a retried create that carries the same idempotency key.
    spec                 jsonb          NOT NULL,
    -- The spec's scheduling fields as typed columns.
    name                 text           NOT NULL,
    mode                 job_mode       NOT NULL,
    gpu_type             text           NOT NULL,
    gpus                 integer        NOT NULL CHECK (gpus > 0),
    gpus_per_worker      integer        NOT NULL CHECK (gpus_per_worker > 0),
    workers              integer        NOT NULL CHECK (workers > 0),
    priority             smallint       NOT NULL,
    required_level       topology_level NOT NULL,
    preferred_level      topology_level NOT NULL,
    -- The tenant's run-time estimate: reservations and backfill use it.
    estimated_duration_s bigint         NOT NULL CHECK (estimated_duration_s > 0),
    state                job_state      NOT NULL DEFAULT 'queued',
    reason               text,
    -- The newest complete checkpoint its workers reported: a restart
    -- resumes from it (GANGWAY_RESTORE_FROM).
    restore_from         text,
    -- How often it was preempted (checkpointed, stopped and requeued).
    preemptions          integer        NOT NULL DEFAULT 0,
    created_at           timestamptz    NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    UNIQUE (tenant, idempotency_key),
    CHECK (gpus = workers * gpus_per_worker)
);
CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at DESC, job_id DESC);
CREATE INDEX jobs_active ON jobs (state) WHERE state NOT IN ('succeeded', 'failed', 'cancelled');

CREATE TABLE workers (
    job_id      uuid         NOT NULL REFERENCES jobs (job_id),
    rank        integer      NOT NULL CHECK (rank >= 0),
    state       worker_state NOT NULL DEFAULT 'pending',
    -- Moves forward on every placement; agents' reports name the attempt
    -- they are about, so a report about an earlier placement is ignored.
    attempt     integer      NOT NULL DEFAULT 0,
    node_id     text         REFERENCES nodes (node_id),
    gpus        integer[]    NOT NULL DEFAULT '{}',
    local_rank  integer,
    exit_code   integer,
    signal      integer,
    message     text,
    started_at  timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (job_id, rank),
    CHECK ((state = 'pending') = (node_id IS NULL) OR state IN ('succeeded', 'failed', 'cancelled'))
);
CREATE INDEX workers_pending ON workers (job_id) WHERE state = 'pending';
CREATE INDEX workers_by_node ON workers (node_id)
    WHERE state IN ('assigned', 'running', 'checkpointing', 'stopping');

-- One row per GPU per placement. An allocation is live until released_at is
-- set; the partial unique index makes a GPU held by two live allocations
-- impossible, whatever the code does (invariant 1). Released rows stay: they
-- are the allocation intervals that metering bills.
CREATE TABLE allocations (
    alloc_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          uuid        NOT NULL,
    rank            integer     NOT NULL,
    attempt         integer     NOT NULL,
    node_id         text        NOT NULL,
    gpu_index       integer     NOT NULL,
    tenant          text        NOT NULL,
    gpu_type        text        NOT NULL,
    generation      bigint      NOT NULL,
    allocated_at    timestamptz NOT NULL DEFAULT now(),
    released_at     timestamptz,
    release_reason  text,
    FOREIGN KEY (job_id, rank) REFERENCES workers (job_id, rank),
    FOREIGN KEY (node_id, gpu_index) REFERENCES gpus (node_id, gpu_index)
);
CREATE UNIQUE INDEX allocations_one_live_per_gpu
    ON allocations (node_id, gpu_index) WHERE released_at IS NULL;
CREATE INDEX allocations_live_by_worker
    ON allocations (job_id, rank) WHERE released_at IS NULL;

CREATE TABLE job_events (
    event_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    uuid        NOT NULL REFERENCES jobs (job_id),
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind      text        NOT NULL CHECK (kind IN
        ('queued', 'placed', 'started', 'worker_exited', 'cancel_requested', 'preempted',
         'requeued', 'finished')),
    message   text        NOT NULL,
    detail    jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX job_events_by_job ON job_events (job_id, event_id);

-- Per-tenant caps on GPUs allocated at once, per GPU type. No row: no cap.
CREATE TABLE quotas (
    tenant    text    NOT NULL,
    gpu_type  text    NOT NULL,
    max_gpus  integer NOT NULL CHECK (max_gpus >= 0),
    PRIMARY KEY (tenant, gpu_type)
);

-- Which region a keyed create goes to, decided once. The global tier claims
-- a key here, in the key's claim region (the first healthy region in the
-- rendezvous order of the job id), before sending the create anywhere, so
-- that concurrent first attempts through different global replicas agree
-- on one region even when their views of capacity differ (invariant 5).
CREATE TABLE idempotency_claims (
    job_id      uuid        PRIMARY KEY,
    tenant      text        NOT NULL,
    region      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
