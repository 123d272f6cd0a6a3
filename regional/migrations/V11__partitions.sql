-- Gangway regional schema, version 11: scheduling partitions, one per GPU
-- type, planned and committed independently (src/scheduler.rs). What is
-- persisted here and why is described in src/store/mod.rs.

-- Each GPU type's scheduling version: a committed plan moves forward the
-- versions of the types it placed or preempted, and a plan whose decisions
-- about a type were computed at an older version is rejected whole. The
-- region-wide `sched_state.generation` now moves only when what may be
-- scheduled changes (nodes, their states, spares, maintenance), so plans
-- for different types no longer invalidate each other. A type's row is
-- created by its first commit (a missing row is version 0).
CREATE TABLE sched_partitions (
    gpu_type   text   PRIMARY KEY,
    generation bigint NOT NULL CHECK (generation > 0)
);

-- `allocations.generation` told a job's runs apart (the newest run has the
-- highest) because every placing commit moved the region generation; now
-- each placing commit takes the next number of this sequence instead,
-- starting above every number used so far.
CREATE SEQUENCE placement_seq;
SELECT setval('placement_seq', greatest(1,
    (SELECT coalesce(max(generation), 0) FROM allocations),
    (SELECT generation FROM sched_state WHERE id = 1)));
