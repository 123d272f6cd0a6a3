-- Jobs not yet held by a buddy region in a table of their own (issue 23).
--
-- A create wrote its job with `jobs.awaits_buddy` and, once a buddy held
-- its intent, cleared it. That column was in a partial index
-- (`jobs_awaiting_buddy`) and in the queue's trigger, so the clearing (the
-- "mark", once per create) was never a HOT update: a new version of the
-- job's row and an entry in every one of the table's twelve indexes, a
-- third of the database's statement time per create. Now a create adds
-- its job here and the mark deletes it (and sets `jobs.buddy`, a column no
-- index reads); the held queue (`store/queue.rs`) notices the deletions by
-- itself. Rows updated in place need room on their page: the table leaves
-- some.
DROP INDEX jobs_awaiting_buddy; -- V16's, on the column: the table takes its name
CREATE TABLE jobs_awaiting_buddy (
    job_id uuid PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL
);
CREATE INDEX jobs_awaiting_buddy_oldest ON jobs_awaiting_buddy (created_at);
INSERT INTO jobs_awaiting_buddy (job_id, created_at)
    SELECT job_id, created_at FROM jobs WHERE awaits_buddy;
-- Its WHEN names the column; `sql/functions.sql` creates it again (on a
-- fresh database it does not exist yet).
DROP TRIGGER IF EXISTS jobs_queue_changed ON jobs;
ALTER TABLE jobs DROP COLUMN awaits_buddy;
ALTER TABLE jobs SET (fillfactor = 80);
