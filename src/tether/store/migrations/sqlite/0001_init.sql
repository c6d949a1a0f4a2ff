-- tether schema, version 1 (SQLite). Times are Unix seconds (REAL) from the database clock.

CREATE TABLE tether_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;

CREATE TABLE tether_jobs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    task                TEXT NOT NULL,
    args                TEXT NOT NULL,
    queue               TEXT NOT NULL,
    priority            INTEGER NOT NULL DEFAULT 0,
    key                 TEXT,
    state               TEXT NOT NULL CHECK (state IN (
                            'queued', 'blocked', 'running', 'retrying',
                            'paused', 'succeeded', 'failed', 'cancelled')),
    attempt             INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 1),
    timeout             REAL CHECK (timeout > 0),
    run_at              REAL NOT NULL,
    created_at          REAL NOT NULL,
    started_at          REAL,
    finished_at         REAL,
    worker_id           TEXT,
    lease_token         INTEGER NOT NULL DEFAULT 0,
    lease_expires_at    REAL,
    heartbeat_at        REAL,
    cancel_requested_at REAL,
    cancel_reason       TEXT,
    cancel_force        INTEGER NOT NULL DEFAULT 0,
    checkpoint          TEXT,
    progress_current    INTEGER,
    progress_total      INTEGER,
    result              TEXT,
    error               TEXT,
    owner               TEXT,
    idempotency_key     TEXT UNIQUE,
    actor               TEXT,
    reason              TEXT,
    CONSTRAINT tether_jobs_lease_iff_running
        CHECK ((state = 'running') = (lease_expires_at IS NOT NULL))
);

CREATE INDEX tether_jobs_claimable ON tether_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('queued', 'retrying');
CREATE INDEX tether_jobs_running ON tether_jobs (worker_id) WHERE state = 'running';
CREATE INDEX tether_jobs_state ON tether_jobs (state, id);

CREATE TABLE tether_job_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    at         REAL NOT NULL,
    worker_id  TEXT,
    actor      TEXT,
    reason     TEXT
);
CREATE INDEX tether_job_events_job ON tether_job_events (job_id, id);

CREATE TABLE tether_workers (
    id           TEXT PRIMARY KEY,
    name         TEXT,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    pid_start    INTEGER,
    backend_pid  INTEGER,
    queues       TEXT NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('active', 'draining', 'stopped', 'dead'))
);

CREATE TRIGGER tether_job_insert AFTER INSERT ON tether_jobs
BEGIN
    SELECT RAISE(ABORT, 'tether: a job cannot start in this state')
        WHERE NEW.state NOT IN ('queued', 'blocked', 'paused');
    INSERT INTO tether_job_events (job_id, from_state, to_state, at, worker_id, actor, reason)
    VALUES (NEW.id, NULL, NEW.state, (julianday('now') - 2440587.5) * 86400.0,
            NEW.worker_id, NEW.actor, NEW.reason);
END;

CREATE TRIGGER tether_job_update AFTER UPDATE OF state ON tether_jobs
WHEN NEW.state IS NOT OLD.state
BEGIN
    SELECT RAISE(ABORT, 'tether: illegal transition')
        WHERE NOT EXISTS (SELECT 1 FROM tether_transitions
                          WHERE from_state = OLD.state AND to_state = NEW.state);
    INSERT INTO tether_job_events (job_id, from_state, to_state, at, worker_id, actor, reason)
    VALUES (NEW.id, OLD.state, NEW.state, (julianday('now') - 2440587.5) * 86400.0,
            NEW.worker_id, NEW.actor, NEW.reason);
END;
