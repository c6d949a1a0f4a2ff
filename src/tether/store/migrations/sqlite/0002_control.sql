-- tether schema, version 2 (SQLite): pause, budgets, concurrency keys, resource slots,
-- queue pauses, cancellation records and artifacts.

ALTER TABLE tether_jobs ADD COLUMN pause_requested_at REAL;
ALTER TABLE tether_jobs ADD COLUMN pause_reason TEXT;
ALTER TABLE tether_jobs ADD COLUMN budget INTEGER CHECK (budget > 0);
ALTER TABLE tether_jobs ADD COLUMN usage INTEGER NOT NULL DEFAULT 0 CHECK (usage >= 0);
-- JSON array of the limits a running job holds: "key:<key>" and "resource:<name>".
ALTER TABLE tether_jobs ADD COLUMN limits TEXT;
ALTER TABLE tether_jobs ADD COLUMN stopped_by TEXT;

CREATE TABLE tether_queues (
    name       TEXT PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0,
    reason     TEXT,
    changed_at REAL NOT NULL
);

CREATE TABLE tether_limits (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('key', 'resource')),
    capacity      INTEGER NOT NULL DEFAULT 1 CHECK (capacity >= 1),
    used          INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0),
    held          INTEGER NOT NULL DEFAULT 0 CHECK (held >= 0),
    block_on_hold INTEGER NOT NULL DEFAULT 1
);

CREATE TABLE tether_cancellations (
    id           TEXT PRIMARY KEY,
    job_id       INTEGER NOT NULL,
    request_id   TEXT UNIQUE,
    reason       TEXT,
    force        INTEGER NOT NULL,
    cascade      INTEGER NOT NULL,
    initiated_by TEXT,
    initiated_at REAL NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('initiated', 'stopping_runners',
                     'updating_tasks', 'cleaning_resources', 'completed', 'partial', 'failed')),
    steps        TEXT NOT NULL DEFAULT '[]',
    result       TEXT,
    error        TEXT,
    completed_at REAL
);
CREATE INDEX tether_cancellations_recent ON tether_cancellations (initiated_at DESC, id);
CREATE INDEX tether_cancellations_job ON tether_cancellations (job_id, initiated_at DESC);
CREATE UNIQUE INDEX tether_cancellations_open ON tether_cancellations (job_id)
    WHERE status NOT IN ('completed', 'partial', 'failed');

CREATE TABLE tether_artifacts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL,
    name       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    data       BLOB NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (job_id, name)
);

CREATE TRIGGER tether_limits_on_insert AFTER INSERT ON tether_jobs
WHEN NEW.limits IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO tether_limits (name, kind)
    SELECT value, 'key' FROM json_each(NEW.limits) WHERE value LIKE 'key:%';
END;

CREATE TRIGGER tether_limits_on_update AFTER UPDATE OF state ON tether_jobs
WHEN NEW.limits IS NOT NULL AND NEW.state IS NOT OLD.state
BEGIN
    UPDATE tether_limits SET
        used = used + (NEW.state = 'running') - (OLD.state = 'running'),
        held = held + CASE WHEN kind = 'key'
            THEN (NEW.state IN ('paused', 'failed')) - (OLD.state IN ('paused', 'failed'))
            ELSE 0 END
    WHERE name IN (SELECT value FROM json_each(NEW.limits));
END;
