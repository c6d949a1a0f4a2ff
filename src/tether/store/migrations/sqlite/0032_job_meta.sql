-- tether schema, version 32 (SQLite): a job's metadata.
--
-- meta is a small JSON object of string keys to string values, set at enqueue and
-- carried with the job (a trace context, an operator's labels); tether.job_meta checks
-- its size and alphabet. NULL when a job has none, so a job without meta writes nothing
-- more. The claim returns it with the rest of the row; no heartbeat or finish touches it.
ALTER TABLE tether_jobs ADD COLUMN meta TEXT;
