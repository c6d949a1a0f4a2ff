-- tether schema, version 1 (PostgreSQL).

CREATE TABLE tether_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
);

CREATE TABLE tether_jobs (
    id                  BIGSERIAL PRIMARY KEY,
    task                TEXT NOT NULL,
    args                JSONB NOT NULL,
    queue               TEXT NOT NULL,
    priority            INTEGER NOT NULL DEFAULT 0,
    key                 TEXT,
    state               TEXT NOT NULL CHECK (state IN (
                            'queued', 'blocked', 'running', 'retrying',
                            'paused', 'succeeded', 'failed', 'cancelled')),
    attempt             INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 1),
    timeout             DOUBLE PRECISION CHECK (timeout > 0),
    run_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at          TIMESTAMPTZ,
    finished_at         TIMESTAMPTZ,
    worker_id           TEXT,
    lease_token         BIGINT NOT NULL DEFAULT 0,
    lease_expires_at    TIMESTAMPTZ,
    heartbeat_at        TIMESTAMPTZ,
    cancel_requested_at TIMESTAMPTZ,
    cancel_reason       TEXT,
    cancel_force        BOOLEAN NOT NULL DEFAULT false,
    checkpoint          JSONB,
    progress_current    BIGINT,
    progress_total      BIGINT,
    result              JSONB,
    error               TEXT,
    owner               TEXT,
    idempotency_key     TEXT UNIQUE,
    -- Who made the latest transition and why; the event trigger copies them.
    actor               TEXT,
    reason              TEXT,
    -- A running job always holds a lease, and no other job does.
    CONSTRAINT tether_jobs_lease_iff_running
        CHECK ((state = 'running') = (lease_expires_at IS NOT NULL))
);

CREATE INDEX tether_jobs_claimable ON tether_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('queued', 'retrying');
-- The running set is small (at most the workers' total concurrency): one partial index
-- serves the rescuer and the per-worker lookups.
CREATE INDEX tether_jobs_running ON tether_jobs (worker_id) WHERE state = 'running';
CREATE INDEX tether_jobs_state ON tether_jobs (state, id);

CREATE TABLE tether_job_events (
    id         BIGSERIAL PRIMARY KEY,
    job_id     BIGINT NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
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
    pid_start    BIGINT,
    backend_pid  INTEGER,
    queues       TEXT NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    state        TEXT NOT NULL CHECK (state IN ('active', 'draining', 'stopped', 'dead'))
);

-- Every transition is checked against tether_transitions and written to the events.
-- Statement-level triggers with transition tables: one check and one INSERT per
-- statement, however many jobs a batch claims or completes.
CREATE FUNCTION tether_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE state NOT IN ('queued', 'blocked', 'paused')) THEN
        RAISE EXCEPTION 'tether: a job must start queued, blocked or paused'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
    SELECT id, NULL, state, worker_id, actor, reason FROM new_rows ORDER BY id;
    RETURN NULL;
END
$$;

CREATE FUNCTION tether_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT o.id, o.state AS src, n.state AS dst INTO bad
    FROM old_rows o JOIN new_rows n USING (id)
    WHERE o.state <> n.state
      AND NOT EXISTS (SELECT 1 FROM tether_transitions t
                      WHERE t.from_state = o.state AND t.to_state = n.state)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'tether: illegal transition % -> % for job %', bad.src, bad.dst, bad.id
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
    SELECT n.id, o.state, n.state, n.worker_id, n.actor, n.reason
    FROM old_rows o JOIN new_rows n USING (id)
    WHERE o.state <> n.state
    ORDER BY n.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER tether_jobs_inserted AFTER INSERT ON tether_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tether_jobs_inserted();

CREATE TRIGGER tether_jobs_updated AFTER UPDATE ON tether_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tether_jobs_updated();
