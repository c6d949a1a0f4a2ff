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
