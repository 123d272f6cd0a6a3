-- Gangway regional schema, version 9: a maintenance plan skips a node that
-- is out of service for a reason outside the plan when its turn comes
-- (gangway_health::maintenance, "Nodes already out") instead of waiting
-- for it forever. What is persisted here and why is described in
-- src/store/mod.rs.

ALTER TABLE maintenance_steps DROP CONSTRAINT maintenance_steps_step_check;
ALTER TABLE maintenance_steps ADD CONSTRAINT maintenance_steps_step_check CHECK (step IN
    ('pending', 'draining', 'rebooting', 'checking', 'done', 'skipped', 'cancelled'));

ALTER TABLE maintenance_steps
    -- Why the plan skipped the node (step 'skipped'): "node lost: …",
    -- "cordoned by an operator: …", "in repair: …".
    ADD COLUMN reason        text,
    -- When the plan first found this pending node out of service for a
    -- passing reason (suspect, held down) at its turn; cleared whenever
    -- the node is seen back in service. Still out long enough after it,
    -- the node is skipped.
    ADD COLUMN waiting_since timestamptz;
