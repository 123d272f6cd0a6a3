-- Workers' standard output and error, shipped by their agents as they are
-- written (issue 24): a chunk per (job, attempt, rank, stream, offset),
-- kept once however often an agent sends it; `seq` orders them as they
-- arrived, and is the readers' cursor. A job keeps at most a bound of
-- bytes (`store/logs.rs`, JOB_LOG_LIMIT_BYTES); what comes after is
-- counted in `job_log_sizes.dropped` and not kept.
CREATE TABLE job_logs (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt integer NOT NULL,
    rank integer NOT NULL,
    stream text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    byte_offset bigint NOT NULL,
    len bigint NOT NULL,
    text text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, attempt, rank, stream, byte_offset)
);
CREATE INDEX job_logs_by_job ON job_logs (job_id, seq);
CREATE TABLE job_log_sizes (
    job_id uuid PRIMARY KEY,
    kept bigint NOT NULL DEFAULT 0,
    dropped bigint NOT NULL DEFAULT 0
);
