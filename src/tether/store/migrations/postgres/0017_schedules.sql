-- tether schema, version 17 (PostgreSQL): periodic schedules. Their definitions live in
-- code; a row keeps what the scheduler did and whether a person paused it.
CREATE TABLE tether_schedules (
    name        TEXT PRIMARY KEY,
    task        TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    paused      BOOLEAN NOT NULL DEFAULT false,
    last_tick   TIMESTAMPTZ,
    next_tick   TIMESTAMPTZ,
    last_run_at TIMESTAMPTZ,
    last_job_id BIGINT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
