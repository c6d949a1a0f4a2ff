-- tether schema, version 32 (PostgreSQL): a job's metadata.
--
-- meta is a small object of string keys to string values, set at enqueue and carried
-- with the job (a trace context, an operator's labels); tether.job_meta checks its
-- size and alphabet. NULL when a job has none, so a job without meta writes nothing
-- more. The claim functions return whole tether_jobs rows (RETURNING *), so a claimed
-- job carries its meta with no change to them; no heartbeat or finish touches it.
ALTER TABLE tether_jobs ADD COLUMN meta JSONB;
