-- tether schema, version 17 (SQLite): periodic schedules. Their definitions live in
-- code; a row keeps what the scheduler did and whether a person paused it.
CREATE TABLE tether_schedules (
    name        TEXT PRIMARY KEY,
    task        TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    paused      INTEGER NOT NULL DEFAULT 0,
    last_tick   REAL,
    next_tick   REAL,
    last_run_at REAL,
    last_job_id INTEGER,
    created_at  REAL NOT NULL
);
