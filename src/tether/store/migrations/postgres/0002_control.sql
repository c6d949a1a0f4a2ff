-- tether schema, version 2 (PostgreSQL): pause, budgets, concurrency keys, resource
-- slots, queue pauses, cancellation records and artifacts.

ALTER TABLE tether_jobs
    ADD COLUMN pause_requested_at TIMESTAMPTZ,
    ADD COLUMN pause_reason       TEXT,
    ADD COLUMN budget             BIGINT CHECK (budget > 0),
    ADD COLUMN usage              BIGINT NOT NULL DEFAULT 0 CHECK (usage >= 0),
    -- The limits a running job holds: 'key:<key>' and 'resource:<name>'.
    ADD COLUMN limits             TEXT[],
    -- How the last attempt was stopped when it was interrupted.
    ADD COLUMN stopped_by         TEXT;

CREATE TABLE tether_queues (
    name       TEXT PRIMARY KEY,
    paused     BOOLEAN NOT NULL DEFAULT false,
    reason     TEXT,
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Counting semaphores: a concurrency key (capacity = running jobs allowed per key) or a
-- resource pool. The job triggers below keep `used` and `held` exact.
CREATE TABLE tether_limits (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('key', 'resource')),
    capacity      INTEGER NOT NULL DEFAULT 1 CHECK (capacity >= 1),
    used          INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0),
    -- Paused or failed jobs under a key; while any exist the key is blocked.
    held          INTEGER NOT NULL DEFAULT 0 CHECK (held >= 0),
    block_on_hold BOOLEAN NOT NULL DEFAULT true
);

CREATE TABLE tether_cancellations (
    id           TEXT PRIMARY KEY,
    job_id       BIGINT NOT NULL,
    request_id   TEXT UNIQUE,
    reason       TEXT,
    force        BOOLEAN NOT NULL,
    cascade      BOOLEAN NOT NULL,
    initiated_by TEXT,
    initiated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    status       TEXT NOT NULL CHECK (status IN ('initiated', 'stopping_runners',
                     'updating_tasks', 'cleaning_resources', 'completed', 'partial', 'failed')),
    steps        JSONB NOT NULL DEFAULT '[]',
    result       JSONB,
    error        TEXT,
    completed_at TIMESTAMPTZ
);
CREATE INDEX tether_cancellations_recent ON tether_cancellations (initiated_at DESC, id);
CREATE INDEX tether_cancellations_job ON tether_cancellations (job_id, initiated_at DESC);
-- Concurrent requests for one job share the record in progress; once it has settled, a
-- job that ran again (a retried failure) can be cancelled again with a record of its own.
CREATE UNIQUE INDEX tether_cancellations_open ON tether_cancellations (job_id)
    WHERE status NOT IN ('completed', 'partial', 'failed');

CREATE TABLE tether_artifacts (
    id         BIGSERIAL PRIMARY KEY,
    job_id     BIGINT NOT NULL,
    name       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    data       BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (job_id, name)
);

-- Keep the limit counters with the jobs, in the same transaction as every transition.
-- Rows are locked in name order so that two concurrent statements cannot deadlock.
CREATE FUNCTION tether_limits_apply(deltas JSONB) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM tether_limits
    WHERE name IN (SELECT jsonb_object_keys(deltas)) ORDER BY name FOR UPDATE;
    UPDATE tether_limits l
    SET used = l.used + (deltas -> l.name ->> 0)::int,
        held = l.held + CASE WHEN l.kind = 'key' THEN (deltas -> l.name ->> 1)::int ELSE 0 END
    WHERE l.name IN (SELECT jsonb_object_keys(deltas));
END
$$;

CREATE OR REPLACE FUNCTION tether_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE state NOT IN ('queued', 'blocked', 'paused')) THEN
        RAISE EXCEPTION 'tether: a job must start queued, blocked or paused'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
    SELECT id, NULL, state, worker_id, actor, reason FROM new_rows ORDER BY id;
    INSERT INTO tether_limits (name, kind)
    SELECT DISTINCT l, 'key' FROM new_rows, unnest(limits) AS l WHERE l LIKE 'key:%'
    ORDER BY l
    ON CONFLICT (name) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION tether_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad record;
    deltas JSONB;
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
    -- Per limit: [change in running jobs, change in paused or failed jobs].
    SELECT jsonb_object_agg(name, jsonb_build_array(used, held)) INTO deltas
    FROM (
        SELECT name, sum(used)::int AS used, sum(held)::int AS held FROM (
            SELECT unnest(n.limits) AS name,
                   (n.state = 'running')::int - (o.state = 'running')::int AS used,
                   (n.state IN ('paused', 'failed'))::int
                       - (o.state IN ('paused', 'failed'))::int AS held
            FROM old_rows o JOIN new_rows n USING (id)
            WHERE n.limits IS NOT NULL AND o.state <> n.state
        ) AS per_job
        GROUP BY name
        HAVING sum(used) <> 0 OR sum(held) <> 0
    ) AS per_limit;
    IF deltas IS NOT NULL THEN
        PERFORM tether_limits_apply(deltas);
    END IF;
    RETURN NULL;
END
$$;

-- Claim up to p_limit jobs. When none of the candidates has limits (the common case),
-- one set-based UPDATE takes them all. Otherwise a job with limits is taken only when
-- every one of its limits has room and is not blocked, checked under a row lock (SKIP
-- LOCKED: a limit being changed is tried next round), one UPDATE per such job so the
-- trigger counts it before the next check.
CREATE FUNCTION tether_claim(p_worker TEXT, p_queues TEXT[], p_tasks TEXT[], p_limit INTEGER,
                             p_lease DOUBLE PRECISION)
RETURNS SETOF tether_jobs LANGUAGE plpgsql AS $$
DECLARE
    c RECORD;
    candidates BIGINT[];
    limited BOOLEAN;
    free_ids BIGINT[] := '{}';
    limited_ids BIGINT[] := '{}';
    taken INTEGER := 0;
    lockable INTEGER;
    roomy BOOLEAN;
BEGIN
    SELECT array_agg(x.id ORDER BY x.priority DESC, x.run_at, x.id),
           coalesce(bool_or(x.limits IS NOT NULL), false)
    INTO candidates, limited
    FROM unnest(p_queues) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.limits, j.priority, j.run_at FROM tether_jobs j
        WHERE j.queue = q.name AND j.state IN ('queued', 'retrying') AND j.run_at <= now()
          AND j.task = ANY(p_tasks)
          AND (j.limits IS NULL OR NOT EXISTS (
                SELECT 1 FROM tether_limits l WHERE l.name = ANY(j.limits)
                AND (l.used >= l.capacity OR (l.held > 0 AND l.block_on_hold))))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    ) AS x
    WHERE NOT EXISTS (SELECT 1 FROM tether_queues p WHERE p.name = q.name AND p.paused);
    IF candidates IS NULL THEN
        RETURN;
    END IF;
    IF NOT limited THEN
        free_ids := candidates[1:p_limit];
    ELSE
        FOR c IN SELECT j.id, j.limits FROM unnest(candidates) WITH ORDINALITY AS u(id, n)
                 JOIN tether_jobs j ON j.id = u.id ORDER BY u.n
        LOOP
            EXIT WHEN taken >= p_limit;
            IF c.limits IS NULL THEN
                free_ids := free_ids || c.id;
                taken := taken + 1;
                CONTINUE;
            END IF;
            SELECT count(*), coalesce(bool_and(s.used < s.capacity
                                               AND (s.held = 0 OR NOT s.block_on_hold)), false)
            INTO lockable, roomy
            FROM (SELECT l.used, l.capacity, l.held, l.block_on_hold FROM tether_limits l
                  WHERE l.name = ANY(c.limits) ORDER BY l.name FOR UPDATE SKIP LOCKED) AS s;
            IF lockable = cardinality(c.limits) AND roomy THEN
                UPDATE tether_jobs SET state = 'running', attempt = attempt + 1,
                    worker_id = p_worker, lease_token = lease_token + 1,
                    lease_expires_at = now() + make_interval(secs => p_lease),
                    heartbeat_at = now(), started_at = now(), result = NULL, stopped_by = NULL,
                    actor = 'worker', reason = NULL
                WHERE id = c.id;
                limited_ids := limited_ids || c.id;
                taken := taken + 1;
            END IF;
        END LOOP;
    END IF;
    RETURN QUERY
    UPDATE tether_jobs SET state = 'running', attempt = attempt + 1,
        worker_id = p_worker, lease_token = lease_token + 1,
        lease_expires_at = now() + make_interval(secs => p_lease),
        heartbeat_at = now(), started_at = now(), result = NULL, stopped_by = NULL,
        actor = 'worker', reason = NULL
    WHERE id = ANY(free_ids)
    RETURNING *;
    IF cardinality(limited_ids) > 0 THEN
        RETURN QUERY SELECT * FROM tether_jobs WHERE id = ANY(limited_ids);
    END IF;
END
$$;
