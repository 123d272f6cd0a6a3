-- What changed in the queue, so that a scheduling pass reads only that
-- (issue 23). The leader keeps each pool's queue in memory
-- (`store/queue.rs`); a pass reads the jobs whose queue-relevant columns
-- or pending workers changed since its previous snapshot, instead of every
-- queued job: at 50,000 queued jobs the whole read took longer than the
-- rest of the pass together.
--
-- `queue_xid` is the transaction that last changed what the queue shows of
-- a job: its insertion, its state, its place in the order, whether it may
-- be placed, or which of its workers still wait. Every change a snapshot S
-- did not see was made by a transaction at or above S's xmin (one that was
-- running when S was taken, or began after it), so "queue_xid >= the
-- previous snapshot's xmin" finds every change since, and some it already
-- saw, which are read again harmlessly. The column's values are assigned
-- by this database alone: clients never write it.
ALTER TABLE jobs ADD COLUMN queue_xid xid8 NOT NULL DEFAULT '0';
-- (Two steps: existing rows get 0 without rewriting the table; the first
-- pass after the upgrade reads the whole queue anyway.)
ALTER TABLE jobs ALTER COLUMN queue_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX jobs_queue_changes ON jobs (queue_xid);

-- The triggers that keep it (and the deletions' epoch below), with their
-- functions: regional/sql/functions.sql (jobs_queue_changed,
-- workers_queue_changed, jobs_deleted), applied after the migrations.

-- A deleted job leaves no row to find: any deletion moves the epoch, and a
-- pass that sees it moved reads the whole queue again.
ALTER TABLE sched_state ADD COLUMN queue_epoch bigint NOT NULL DEFAULT 0;
