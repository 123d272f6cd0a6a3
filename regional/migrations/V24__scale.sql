-- A 10,000-GPU region under load (issue 19): the queries a failure runs
-- while many nodes are in trouble are bounded by indexes, not by the size
-- of the fleet.

-- Spare search (store/spares.rs `find_spare`): the spares of a GPU type,
-- a handful per region.
CREATE INDEX nodes_spares ON nodes (gpu_type) WHERE spare;

-- A rack's facts (throttling, power budget, what it draws) read per leaf:
-- spare search, placement's power headroom.
CREATE INDEX nodes_by_leaf ON nodes (leaf);
