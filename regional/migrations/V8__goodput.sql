-- Gangway regional schema, version 8: goodput. What is persisted here and
-- why is described in src/store/mod.rs.

ALTER TABLE jobs
    -- GPU-seconds of work lost to restarts: for each run that ended in a
    -- requeue (preemption, drain, health, a lost node, a fenced agent), the
    -- GPU time its allocations held after the job's last checkpoint. Useful
    -- GPU time is the allocated GPU time (from `allocations`) minus this.
    ADD COLUMN lost_gpu_s double precision NOT NULL DEFAULT 0 CHECK (lost_gpu_s >= 0);
