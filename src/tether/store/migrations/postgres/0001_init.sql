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
CREATE INDEX tether_jobs_leases ON tether_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX tether_jobs_worker ON tether_jobs (worker_id) WHERE state = 'running';
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
CREATE FUNCTION tether_job_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('queued', 'blocked', 'paused') THEN
            RAISE EXCEPTION 'tether: a job cannot start in state %', NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
        VALUES (NEW.id, NULL, NEW.state, NEW.worker_id, NEW.actor, NEW.reason);
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NOT EXISTS (SELECT 1 FROM tether_transitions
                       WHERE from_state = OLD.state AND to_state = NEW.state) THEN
            RAISE EXCEPTION 'tether: illegal transition % -> % for job %',
                OLD.state, NEW.state, OLD.id USING ERRCODE = 'check_violation';
        END IF;
        INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
        VALUES (NEW.id, OLD.state, NEW.state, NEW.worker_id, NEW.actor, NEW.reason);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tether_job_transition
    AFTER INSERT OR UPDATE OF state ON tether_jobs
    FOR EACH ROW EXECUTE FUNCTION tether_job_transition();
