-- Gangway regional schema, version 12: rack power budgets and rack thermal
-- throttling. Placement never takes a rack's allocated GPUs past its
-- budget, and a rack reporting thermal throttling takes no new work until
-- it recovers. What is persisted here and why is described in
-- src/store/mod.rs.

ALTER TABLE nodes
    -- Watts one allocated GPU of the node draws (its enforced power limit),
    -- as its agent registered it. NULL: unknown, not counted.
    ADD COLUMN gpu_power_w integer CHECK (gpu_power_w > 0),
    -- The power budget of the node's rack (its leaf) for GPU draw, in
    -- watts, as its agent registered it; a rack's budget is the smallest
    -- its nodes report. NULL: no budget.
    ADD COLUMN rack_power_budget_w bigint CHECK (rack_power_budget_w > 0),
    -- The node's latest report (or injected fault) says its rack is
    -- thermally throttling: no node of the leaf takes new work until a
    -- report says it recovered.
    ADD COLUMN rack_throttled boolean NOT NULL DEFAULT false;

-- The snapshot's "which racks are throttling" look, from the index alone.
CREATE INDEX nodes_rack_throttled ON nodes (leaf) WHERE rack_throttled;
