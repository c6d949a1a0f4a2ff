-- tether schema, version 30 (PostgreSQL): durable steps, sleeps and signals.
--
-- tether_steps holds what a job's attempts completed, one row per step name: a step's
-- JSON result ('done'), or a sleep or a wait for a signal still under way ('waiting',
-- until wakes_at; a wait past it without its signal is 'timed_out'). Every write of a
-- row is fenced by the job's lease token in its transaction (tether.store.common.steps),
-- so a zombie's step never counts. A later attempt reads the rows and runs only the
-- steps that have none.
--
-- tether_signals keeps what was sent to a job, once per name, until the job is pruned:
-- a signal sent before the job waits for it is delivered when the wait comes.
--
-- Neither table is read by the claim, a heartbeat or a finish: a job that uses no
-- steps costs nothing more.
CREATE TABLE tether_steps (
    job_id      BIGINT NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('step', 'sleep', 'signal')),
    state       TEXT NOT NULL CHECK (state IN ('done', 'waiting', 'timed_out')),
    result      JSONB,
    attempt     INTEGER NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ,
    wakes_at    TIMESTAMPTZ,
    usage       BIGINT NOT NULL DEFAULT 0,
    -- The order the steps began in: their times are the database's, less a duration the
    -- worker measured, and may tie or cross.
    seq         BIGINT GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (job_id, name)
);

CREATE TABLE tether_signals (
    job_id  BIGINT NOT NULL,
    name    TEXT NOT NULL,
    payload JSONB,
    sent_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_by TEXT,
    PRIMARY KEY (job_id, name)
);

-- A step's record in one round trip (tether.store.common.steps, save_step): 1 when it
-- is recorded, 0 when the lease is lost, -1 when the step was already done. The lease's
-- row is share-locked first, waiting for a rescue in flight (bounded, as in
-- tether_limits_apply, unless the caller set a bound of its own), and held to the
-- commit: a rescue cannot come between the check and the write, and a step whose lease
-- was lost meanwhile is not written. The unique key can hold the INSERT up only for an
-- attempt that holds the same lease, which cannot exist: a new token needs a rescue,
-- and the rescue waits for this share lock.
CREATE FUNCTION tether_save_step(p_id BIGINT, p_token BIGINT, p_name TEXT, p_result JSONB,
                                 p_took DOUBLE PRECISION, p_usage BIGINT)
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    n INTEGER;
BEGIN
    IF current_setting('lock_timeout') = '0' THEN
        PERFORM set_config('lock_timeout', '2s', true);  -- driver.ROW_LOCK_WAIT
    END IF;
    PERFORM 1 FROM tether_jobs
    WHERE id = p_id AND lease_token = p_token AND state = 'running' FOR SHARE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO tether_steps (job_id, name, kind, state, result, attempt, started_at,
                              finished_at, usage)
    SELECT p_id, p_name, 'step', 'done', p_result, j.attempt,
           now() - make_interval(secs => p_took), now(), p_usage
    FROM tether_jobs j WHERE j.id = p_id
    ON CONFLICT (job_id, name) DO UPDATE SET state = 'done', result = excluded.result,
        attempt = excluded.attempt, finished_at = excluded.finished_at,
        usage = tether_steps.usage + excluded.usage
    WHERE tether_steps.state <> 'done';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN CASE WHEN n = 1 THEN 1 ELSE -1 END;
END
$$;
