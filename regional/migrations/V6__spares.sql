-- Gangway regional schema, version 6: spare swaps. What is persisted here
-- and why is described in src/store/mod.rs.

ALTER TABLE nodes
    -- The region has changed this node's `spare` flag (a spare swapped in
    -- for a failed node, or a swapped-out node back in the pool): its
    -- agent's registration no longer overwrites it.
    ADD COLUMN spare_managed boolean NOT NULL DEFAULT false,
    -- Swapped out for a spare and sent to repair: when an operator returns
    -- it from repair it joins the spare pool.
    ADD COLUMN refill_spare boolean NOT NULL DEFAULT false;

-- GPUs held for a gang being moved onto a spare: its old nodes' GPUs
-- (minus the failed node's) and the spare's, rank by rank. While the gang
-- is being preempted (its workers checkpoint and stop) the snapshot counts
-- them as taken, so nothing else is placed there; when its last worker is
-- down it is placed onto them in the same transaction.
CREATE TABLE gpu_holds (
    node_id   text    NOT NULL REFERENCES nodes (node_id),
    gpu_index integer NOT NULL,
    job_id    uuid    NOT NULL REFERENCES jobs (job_id),
    rank      integer NOT NULL,
    PRIMARY KEY (node_id, gpu_index)
);
CREATE INDEX gpu_holds_job ON gpu_holds (job_id);

-- Timelines name spare swaps.
ALTER TABLE node_events DROP CONSTRAINT node_events_kind_check,
    ADD CONSTRAINT node_events_kind_check CHECK (kind IN
        ('health', 'admin', 'fault_injected', 'evacuate', 'lost', 'state', 'spare'));
ALTER TABLE job_events DROP CONSTRAINT job_events_kind_check,
    ADD CONSTRAINT job_events_kind_check CHECK (kind IN
        ('queued', 'placed', 'started', 'worker_exited', 'cancel_requested', 'preempted',
         'requeued', 'finished', 'spare_swap'));
