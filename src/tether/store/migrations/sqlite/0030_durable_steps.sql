-- tether schema, version 30 (SQLite): durable steps, sleeps and signals; see the
-- PostgreSQL file of the same version. Times are Unix seconds.
CREATE TABLE tether_steps (
    job_id      INTEGER NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('step', 'sleep', 'signal')),
    state       TEXT NOT NULL CHECK (state IN ('done', 'waiting', 'timed_out')),
    result      TEXT,
    attempt     INTEGER NOT NULL,
    started_at  REAL NOT NULL,
    finished_at REAL,
    wakes_at    REAL,
    usage       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, name)
);

CREATE TABLE tether_signals (
    job_id  INTEGER NOT NULL,
    name    TEXT NOT NULL,
    payload TEXT,
    sent_at REAL NOT NULL,
    sent_by TEXT,
    PRIMARY KEY (job_id, name)
);
