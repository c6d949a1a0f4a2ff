-- tether schema, version 31 (PostgreSQL): a job's own log.
--
-- The lines a handler writes (ctx.log, or the logging module inside a handler), kept
-- with the job and removed with it (retention and deletion list this table with the
-- job's other rows). A worker writes them in batches, fenced by the job's lease token
-- (tether.store.common.logs): a zombie's lines are refused. seq numbers a job's lines
-- from 1 in the order they were written; the primary key reads them in that order
-- after any seq. At most AppConfig.job_log_max_lines lines and job_log_max_bytes bytes
-- of messages are kept per job, the first ones: what comes after is counted in one
-- last row of level 'dropped', whose message is that count.
--
-- Neither the claim, a heartbeat nor a finish reads this table: a job that logs
-- nothing costs nothing more.
CREATE TABLE tether_job_logs (
    job_id  BIGINT NOT NULL,
    seq     INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      TIMESTAMPTZ NOT NULL,
    level   TEXT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
