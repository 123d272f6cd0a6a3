-- Gangway regional schema, version 7: rolling maintenance. What is
-- persisted here and why is described in src/store/mod.rs.

CREATE TABLE maintenance_plans (
    plan_id        uuid        PRIMARY KEY,
    created_at     timestamptz NOT NULL DEFAULT now(),
    created_by     text        NOT NULL,
    reason         text,
    -- The request's targets, as asked (MaintenanceStart).
    targets        jsonb       NOT NULL,
    per_leaf       integer     NOT NULL CHECK (per_leaf >= 1),
    region_percent integer     NOT NULL CHECK (region_percent BETWEEN 1 AND 100),
    state          text        NOT NULL DEFAULT 'running'
                               CHECK (state IN ('running', 'done', 'cancelled')),
    -- Why the last tick started no more nodes (gangway_health::Held).
    held           jsonb,
    finished_at    timestamptz
);
-- One plan runs at a time in a region.
CREATE UNIQUE INDEX maintenance_one_running ON maintenance_plans ((true))
    WHERE state = 'running';

CREATE TABLE maintenance_steps (
    plan_id     uuid        NOT NULL REFERENCES maintenance_plans (plan_id),
    node_id     text        NOT NULL REFERENCES nodes (node_id),
    step        text        NOT NULL DEFAULT 'pending' CHECK (step IN
        ('pending', 'draining', 'rebooting', 'checking', 'done', 'cancelled')),
    -- The node's boot id when it was told to reboot: it is back when its
    -- agent reports another.
    boot_before text,
    started_at  timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (plan_id, node_id)
);
