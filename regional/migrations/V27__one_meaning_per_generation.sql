-- One meaning per "generation" (issue 20). `sched_state.generation` stays
-- what it is: the region's scheduling generation, moved by every change to
-- what may be scheduled. The two other counters that shared the name are
-- renamed for what they are:
--
-- - a pool's counter in `sched_partitions` is its version, moved by every
--   plan that places or preempts in the pool;
-- - `allocations.generation` numbered placing commits (from
--   `placement_seq`, so a job's newest run has the highest): it is the
--   placement's sequence number.
ALTER TABLE sched_partitions RENAME COLUMN generation TO version;
ALTER TABLE allocations RENAME COLUMN generation TO placement_seq;
