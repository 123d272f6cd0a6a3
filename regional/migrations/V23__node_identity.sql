-- A node joins as itself (issue 18, docs/operations.md "How a machine
-- joins").
--
-- The region's inventory, not the agent, says which machines belong to the
-- region and where each sits in the topology. An agent registers the names
-- of the machines it serves and what it found on them (GPUs, address); a
-- name the inventory does not have is refused and kept in `unknown_nodes`
-- for an operator to admit; a name the inventory binds to another agent is
-- refused too.

-- Operator intent (or the fleet file's, loaded at start-up): which
-- machines belong here and where they sit. Nothing else can tell us this
-- again, so it is persisted.
CREATE TABLE inventory (
    node_id             text        PRIMARY KEY,
    -- The agent that may serve the node (its token's subject). NULL: an
    -- agent named as the node itself, a real machine's own agent.
    agent_id            text,
    spine               text        NOT NULL,
    leaf                text        NOT NULL,
    nvlink_domain       text        NOT NULL,
    spare               boolean     NOT NULL DEFAULT false,
    -- The GPU type the machine must report. NULL: whatever it reports.
    gpu_type            text,
    rack_power_budget_w bigint      CHECK (rack_power_budget_w > 0),
    -- Where the entry came from: the region's --inventory fleet file, an
    -- operator (`gangway admin node add` / `admit`), or this migration
    -- (the nodes registered before the inventory existed).
    source              text        NOT NULL CHECK (source IN ('fleet', 'operator', 'migrated')),
    added_at            timestamptz NOT NULL DEFAULT now(),
    added_by            text
);

-- The machines registered before the inventory: each stays where its
-- agent said it was, served by the agent that serves it now, so an upgrade
-- does not turn the fleet away.
INSERT INTO inventory (node_id, agent_id, spine, leaf, nvlink_domain, spare, gpu_type,
                       rack_power_budget_w, source)
SELECT node_id, CASE WHEN agent_id = node_id THEN NULL ELSE agent_id END, spine, leaf,
       nvlink_domain, spare, gpu_type, rack_power_budget_w, 'migrated'
FROM nodes;

-- Machines that tried to join and were refused: what an operator needs to
-- decide whether to admit them. Rebuilt by the machines themselves (they
-- keep trying), so a lost row costs nothing.
CREATE TABLE unknown_nodes (
    node_id        text        PRIMARY KEY,
    agent_id       text        NOT NULL,
    executor       text        NOT NULL,
    gpu_type       text        NOT NULL,
    gpus           integer     NOT NULL,
    address        text        NOT NULL,
    -- `not_in_inventory`, or `wrong_agent` (the inventory binds the node
    -- to another agent).
    reason         text        NOT NULL CHECK (reason IN ('not_in_inventory', 'wrong_agent')),
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now()
);

-- Who holds each agent's nodes: the claimant (a hash of the machine's id
-- and the agent's work directory, the same across restarts of one agent on
-- one machine; NULL from agents before identity), and whether an operator
-- released the claim so that another claimant may take the nodes now.
ALTER TABLE agents ADD COLUMN host_id text;
ALTER TABLE agents ADD COLUMN claim_released boolean NOT NULL DEFAULT false;

-- What a real machine's agent found on each GPU (NVML, or declared): the
-- model, its memory and where it sits on the PCI bus. NULL: simulated, or
-- an agent before identity.
ALTER TABLE gpus ADD COLUMN model text;
ALTER TABLE gpus ADD COLUMN memory_mib bigint;
ALTER TABLE gpus ADD COLUMN pci_bus_id text;
