-- tether schema, version 27 (PostgreSQL): fewer index entries per job.
--
-- Claiming and finishing change a job's state, so neither update can be HOT: each new row
-- version gets an entry in every index of tether_jobs whose predicate it meets. Two
-- indexes took an entry from every version of every job:
--
-- - the idempotency key's unique index, which held the NULL key of every job enqueued
--   without one. Only jobs with a key are looked up by it (TAKEN_KEYS, RELEASE_KEYS,
--   the insert's ON CONFLICT, which names the same predicate);
-- - (state, id), which the listings by state read. The succeeded jobs, most of the table,
--   are left out: a listing of them reads the newest rows by id and finds them at once,
--   and the counts by state take the succeeded ones as the rest of the table (COUNT_BY_STATE).
--
-- A job that succeeds now writes two entries fewer at the claim and two at the finish.
CREATE UNIQUE INDEX tether_jobs_idempotency_key ON tether_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
ALTER TABLE tether_jobs DROP CONSTRAINT tether_jobs_idempotency_key_key;

CREATE INDEX tether_jobs_unsucceeded ON tether_jobs (state, id) WHERE state <> 'succeeded';
DROP INDEX tether_jobs_state;
