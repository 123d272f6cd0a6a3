-- Gangway regional schema, version 4: fleet operations — node health, the
-- operators' node actions and the audit log. What is persisted here and why
-- is described in src/store/mod.rs.

-- What operators asked of a node (gangway_health::Admin), as columns:
-- `operator_state` says which, the rest its details. `repair` joins the
-- states: a node sent out for repair stays out until an operator returns it.
ALTER TABLE nodes DROP CONSTRAINT nodes_operator_state_check;
ALTER TABLE nodes
    ADD CONSTRAINT nodes_operator_state_check
        CHECK (operator_state IN ('active', 'cordoned', 'draining', 'maintenance', 'repair')),
    -- Why (cordon, drain, repair), or the maintenance plan's id.
    ADD COLUMN admin_reason text,
    -- While draining: whether jobs may finish first (`wait`) and the
    -- deadline after which they are checkpointed and moved anyway.
    ADD COLUMN drain_wait boolean,
    ADD COLUMN drain_deadline timestamptz,
    ADD CONSTRAINT nodes_drain_details
        CHECK ((operator_state = 'draining') = (drain_wait IS NOT NULL AND drain_deadline IS NOT NULL)),
    -- What the node's signals add up to (gangway_health::NodeHealth,
    -- serialized): the policy's memory of faults, quarantines, flaps and
    -- failures. Opaque to SQL; the pure crate reads and writes it.
    ADD COLUMN health jsonb,
    -- The observed state's code at the last write (healthy, degraded,
    -- suspect, lost, failed, damped, needs_repair), and the GPUs new work
    -- may use then: for listings and capacity. The scheduler decides from
    -- `health` and the clock itself.
    ADD COLUMN observed text NOT NULL DEFAULT 'suspect'
        CHECK (observed IN ('healthy', 'degraded', 'suspect', 'lost', 'failed', 'damped',
                            'needs_repair')),
    ADD COLUMN usable integer[] NOT NULL DEFAULT '{}',
    -- The machine's boot id as its agent last reported it, and when the
    -- region last fed the node a heartbeat.
    ADD COLUMN boot_id text,
    ADD COLUMN last_heartbeat_at timestamptz,
    -- Simulated fleets only (injected faults): a dead node's heartbeats are
    -- ignored until it reboots; a flapping link's until `silent_until`; a
    -- simulated reboot bumps `sim_reboots`, which the node's boot id carries.
    ADD COLUMN sim_down boolean NOT NULL DEFAULT false,
    ADD COLUMN silent_until timestamptz,
    ADD COLUMN sim_reboots integer NOT NULL DEFAULT 0 CHECK (sim_reboots >= 0);

-- Nodes that need the health tick's attention (not plainly healthy and
-- active); the rest are looked at only when their heartbeat goes stale.
CREATE INDEX nodes_needing_attention ON nodes (node_id)
    WHERE observed <> 'healthy' OR operator_state <> 'active';

-- A node's timeline: health effects, operator actions, injected faults,
-- evacuations.
CREATE TABLE node_events (
    event_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    node_id   text        NOT NULL REFERENCES nodes (node_id),
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind      text        NOT NULL CHECK (kind IN
        ('health', 'admin', 'fault_injected', 'evacuate', 'lost', 'state')),
    message   text        NOT NULL,
    detail    jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX node_events_by_node ON node_events (node_id, event_id);

ALTER TABLE jobs
    -- Moved off a node for the node's sake (drained, failed, lost): it goes
    -- to the front of its queue rather than back in submission order, until
    -- it is placed again.
    ADD COLUMN requeue_front boolean NOT NULL DEFAULT false;

-- Every operator action, append-only: who (the admin token's subject), what,
-- on what, when and why. Readable by admins through the API, by no tenant.
CREATE TABLE audit_log (
    audit_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor     text        NOT NULL,
    action    text        NOT NULL,
    target    text        NOT NULL,
    reason    text,
    detail    jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_by_target ON audit_log (target, audit_id);

-- Append-only in the database too, whatever the code does.
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END
$$;
CREATE TRIGGER audit_log_no_update_or_delete
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
