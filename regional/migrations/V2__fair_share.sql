-- Gangway regional schema, version 2: fair sharing and scheduler-driven
-- preemption. What is persisted here and why is described in src/store/mod.rs.

-- Quotas become terms: GPUs a tenant is guaranteed (lent to others while it
-- does not use them, taken back by preemption when it does), a fair-share
-- weight, and an optional hard cap (the borrowing limit). Existing rows keep
-- their cap and guarantee nothing.
ALTER TABLE quotas
    ADD COLUMN guaranteed_gpus integer NOT NULL DEFAULT 0 CHECK (guaranteed_gpus >= 0),
    -- In thousandths: 1000 = weight 1.0.
    ADD COLUMN weight integer NOT NULL DEFAULT 1000 CHECK (weight > 0),
    ALTER COLUMN max_gpus DROP NOT NULL,
    ADD CONSTRAINT quotas_cap_covers_guarantee
        CHECK (max_gpus IS NULL OR max_gpus >= guaranteed_gpus);

ALTER TABLE jobs
    -- When its workers last reported a new checkpoint (`restore_from`
    -- changed): the work since then is what a preemption puts at risk.
    ADD COLUMN checkpointed_at timestamptz,
    -- Set while a preemption is in flight: the job it makes room for, or ''
    -- when an operator asked. Cleared when the job requeues or ends.
    ADD COLUMN preempted_for text;

-- Fair sharing reads the recent allocation intervals (decayed usage); the
-- live ones and those released within the look-back.
CREATE INDEX allocations_by_release ON allocations (released_at);
