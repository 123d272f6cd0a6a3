-- Gangway regional schema, version 15: checkpoints in the region's
-- checkpoint store (docs/jobs.md). What is persisted here and why is
-- described in src/store/mod.rs; how a report is recorded in
-- src/store/checkpoints.rs.

-- The job's ownership epoch: 1 where it was created, moved when another
-- region adopts it (docs/failover.md). Its workers upload checkpoints
-- under it, and a checkpoint of another epoch is refused.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS epoch integer NOT NULL DEFAULT 1;

-- One row per checkpoint committed to the store (its manifest written)
-- and reported by an agent: the store's commit record as the region knows
-- it. The job's newest checkpoint is its highest (epoch, seq, attempt);
-- `jobs.restore_from` holds that one's key, for the next start.
CREATE TABLE checkpoints (
    job_id      uuid        NOT NULL REFERENCES jobs (job_id),
    epoch       integer     NOT NULL CHECK (epoch > 0),
    seq         bigint      NOT NULL CHECK (seq >= 0),
    -- The placement attempt that wrote it: tells apart two uploads that
    -- chose the same seq (the later attempt wins).
    attempt     integer     NOT NULL,
    -- jobs/{job}/epoch-{e}/seq-{n:08}-attempt-{a}; the manifest is
    -- {key}/manifest.json.
    key         text        NOT NULL UNIQUE,
    -- The directory name the job gave it (restores recreate it).
    name        text        NOT NULL,
    size_bytes  bigint      NOT NULL CHECK (size_bytes >= 0),
    files       integer     NOT NULL CHECK (files >= 0),
    -- SHA-256 over the manifest's file list, hex.
    sha256      text        NOT NULL,
    -- When its upload began (the agent's clock), and when we recorded it.
    created_at  timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    -- agent/node/rank that uploaded it.
    reported_by text        NOT NULL,
    PRIMARY KEY (job_id, epoch, seq, attempt)
);
