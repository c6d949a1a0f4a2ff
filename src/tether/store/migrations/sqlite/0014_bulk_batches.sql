-- A bulk enqueue commits in chunks, so that no single transaction holds the write lock
-- for long. Its jobs carry the batch id; while the batch is open (a row here) they are
-- not claimable, and a failed batch deletes them: the bulk stays all-or-nothing.
ALTER TABLE tether_jobs ADD COLUMN batch TEXT;
CREATE INDEX tether_jobs_batch ON tether_jobs (batch) WHERE batch IS NOT NULL;
CREATE TABLE tether_open_batches (
    id         TEXT PRIMARY KEY,
    touched_at REAL NOT NULL
);
