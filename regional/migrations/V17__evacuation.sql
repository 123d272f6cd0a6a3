-- Gangway regional schema, version 17: planned evacuation of a region and
-- fail back (docs/failover.md, "Planned evacuation and fail back"). What is
-- persisted here and why is described in src/store/mod.rs; the protocol in
-- src/evacuation.rs and src/store/handovers.rs.

-- What an operator asked of this region, one row: `none`, `evacuating`
-- (refuse new jobs, place nothing, hand every live job to another region),
-- `evacuated` (the same, nothing left to hand over) or `failing_back`
-- (accepting work again while the jobs moved away come back). Operator
-- intent that nothing else can tell us again, so it survives restarts.
-- `away`: while failing back, how many jobs moved away from this region
-- its peers last said they still run.
CREATE TABLE region_evacuation (
    id         integer     PRIMARY KEY CHECK (id = 1),
    state      text        NOT NULL DEFAULT 'none'
                           CHECK (state IN ('none', 'evacuating', 'evacuated', 'failing_back')),
    since      timestamptz,
    actor      text,
    reason     text,
    away       integer     NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO region_evacuation (id) VALUES (1);

-- A job being handed to another region by a planned move (an evacuation
-- of this region, or a fail back to the region it came from): the region
-- it goes to and why (`evacuating`, `failing_back`). The durable marker
-- the leader's beat advances the handover from, step by step, so a
-- restart anywhere resumes it; while it is set the job is never placed
-- here. Cleared once the job is handed over (or ended here first).
ALTER TABLE jobs
    ADD COLUMN handover_to    text,
    ADD COLUMN handover_cause text;
CREATE INDEX jobs_handing_over ON jobs (job_id) WHERE handover_to IS NOT NULL;

-- Whether a witnessed move was planned by its home (an evacuation or a
-- fail back: recorded while the home is heard) rather than an adoption of
-- a silent home.
ALTER TABLE job_moves ADD COLUMN planned boolean NOT NULL DEFAULT false;

-- Planned handovers this region completed: `out` (this region's copy was
-- released, the job runs at `to_region` at `epoch`), `in` (this region
-- took the job at `epoch` from `from_region`). What an evacuation's or a
-- fail back's progress is counted from.
CREATE TABLE handovers (
    job_id      uuid        NOT NULL,
    epoch       integer     NOT NULL,
    way         text        NOT NULL CHECK (way IN ('out', 'in')),
    from_region text        NOT NULL,
    to_region   text        NOT NULL,
    cause       text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, epoch, way)
);
CREATE INDEX handovers_by_time ON handovers (at);

-- Timelines name handovers: a job marked to move (`handover`), and a
-- home's copy released once the other region has it (`handed_over`).
ALTER TABLE job_events DROP CONSTRAINT job_events_kind_check,
    ADD CONSTRAINT job_events_kind_check CHECK (kind IN
        ('queued', 'placed', 'started', 'worker_exited', 'cancel_requested', 'preempted',
         'requeued', 'finished', 'spare_swap', 'handover', 'handed_over'));
