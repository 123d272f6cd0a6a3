-- Gangway regional schema, version 26: a scheduling partition is a pool —
-- a GPU type's shared pool, or a dedicated cluster's (`cluster:<id>`) — so
-- its key column says so (issue 20: names that say what they mean). The
-- key is computed in one place, `pool_of` (regional/sql/functions.sql),
-- and in Rust by `store::clusters::pool_key`.
ALTER TABLE sched_partitions RENAME COLUMN gpu_type TO pool;
