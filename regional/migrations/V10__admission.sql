-- Gangway regional schema, version 10: per-tenant admission control. A
-- tenant over one of its limits is refused at submission (429, with the
-- limit and the count) instead of being accepted and left to starve. What
-- is persisted here and why is described in src/store/mod.rs.

-- Operator-set limits per tenant in this region. No row: no limits (and
-- submission takes its one-statement path). NULL: no limit on that
-- dimension.
CREATE TABLE tenant_limits (
    tenant           text        PRIMARY KEY,
    -- The most of the tenant's jobs in state 'queued' at once.
    max_queued_jobs  integer     CHECK (max_queued_jobs >= 0),
    -- The most GPUs the tenant's unfinished jobs (every state but
    -- succeeded, failed and cancelled) may ask for together.
    max_gpus         integer     CHECK (max_gpus >= 0),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- What a limited tenant's submission counts: its unfinished jobs, their
-- states and GPUs, read from the index alone.
CREATE INDEX jobs_unfinished_by_tenant ON jobs (tenant, state) INCLUDE (gpus)
    WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
