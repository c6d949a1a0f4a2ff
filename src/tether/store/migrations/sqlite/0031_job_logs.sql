-- tether schema, version 31 (SQLite): a job's own log; see the PostgreSQL file of the
-- same version. Times are Unix seconds.
CREATE TABLE tether_job_logs (
    job_id  INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      REAL NOT NULL,
    level   TEXT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
