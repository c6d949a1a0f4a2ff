-- tether schema, version 28 (PostgreSQL): a lighter history.
--
-- Every transition wrote a row into tether_job_events, and an entry into each of its two
-- indexes: three rows and six entries for a job that simply runs and succeeds, a third
-- of the WAL of a drain. Those three transitions can be read off the job's own row:
--
-- - its creation, queued by an enqueue: at created_at, by 'enqueue';
-- - the claim of its current run: at started_at, by its worker_id (actor 'worker');
-- - its success: at finished_at, with the row's worker_id, actor and reason.
--
-- So they are written only while a live feed follows the transitions (it reads
-- tether_job_events by id, and says so in a row of tether_listeners, 'tether_feed',
-- that it renews). Every other transition is written as before, and a job leaving a
-- run other than by succeeding first writes that run's claim, whose row values are
-- about to change. tether_job_history gives a job's whole history, stored and derived,
-- in order (rank, then id); a derived transition has no id, and is derived only where
-- none like it is stored.
--
-- The jobs that exist when this version is applied keep storing every transition, and
-- nothing of theirs is derived: their stored history is whole, and written by earlier
-- code that need not have stamped a claim exactly at the job's started_at.
CREATE TABLE tether_lighter_history (
    only_row  BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    since_job BIGINT NOT NULL
);
INSERT INTO tether_lighter_history (since_job) SELECT COALESCE(max(id), 0) FROM tether_jobs;

CREATE OR REPLACE FUNCTION tether_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE state NOT IN ('queued', 'blocked', 'paused')) THEN
        RAISE EXCEPTION 'tether: a job must start queued, blocked or paused'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
    SELECT id, NULL, state, worker_id, actor, reason FROM new_rows
    WHERE NOT (state = 'queued' AND actor = 'enqueue' AND worker_id IS NULL AND reason IS NULL)
       OR id <= COALESCE((SELECT since_job FROM tether_lighter_history), 0)
       OR EXISTS (SELECT 1 FROM tether_listeners
                  WHERE channel = 'tether_feed' AND until > now())
    ORDER BY id;
    INSERT INTO tether_limits (name, kind)
    SELECT DISTINCT l, 'key' FROM new_rows, unnest(limits) AS l WHERE l LIKE 'key:%'
    ORDER BY l
    ON CONFLICT (name) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION tether_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad TEXT;
    deltas JSONB;
    changed BIGINT[];
    requeued BOOLEAN;
    linked BOOLEAN;
    everything BOOLEAN := EXISTS (SELECT 1 FROM tether_listeners
                                  WHERE channel = 'tether_feed' AND until > now());
    since_job BIGINT := COALESCE((SELECT l.since_job FROM tether_lighter_history l), 0);
BEGIN
    WITH pairs AS MATERIALIZED (
        -- Each id appears once in old_rows and once in new_rows; only the new row
        -- fills the columns after src.
        SELECT id, max(src) AS src, max(dst) AS dst, max(worker_id) AS worker_id,
               max(actor) AS actor, max(reason) AS reason, max(limits) AS limits,
               bool_or(in_workflow) AS in_workflow, max(claimed_at) AS claimed_at,
               max(claimed_by) AS claimed_by
        FROM (
            SELECT id, state AS src, NULL::text AS dst, NULL::text AS worker_id,
                   NULL::text AS actor, NULL::text AS reason, NULL::text[] AS limits,
                   NULL::boolean AS in_workflow, started_at AS claimed_at,
                   worker_id AS claimed_by
            FROM old_rows
            UNION ALL
            SELECT id, NULL, state, worker_id, actor, reason, limits,
                   has_children OR has_dependents OR parent_id IS NOT NULL OR waiting_children,
                   NULL::timestamptz, NULL::text
            FROM new_rows
        ) AS sides
        GROUP BY id
        HAVING max(src) <> max(dst)
    ), bad AS (
        SELECT format('%s -> %s for job %s', src, dst, id) AS what FROM pairs p
        WHERE NOT EXISTS (SELECT 1 FROM tether_transitions t
                          WHERE t.from_state = p.src AND t.to_state = p.dst)
        LIMIT 1
    ), events AS (
        INSERT INTO tether_job_events (job_id, from_state, to_state, at, worker_id, actor,
                                       reason)
        SELECT job_id, from_state, to_state, at, worker_id, actor, reason FROM (
            -- A job leaving a run other than by succeeding: first the claim of that run,
            -- which was not written when it happened (unless it was).
            SELECT p.id AS job_id,
                   COALESCE((SELECT e.to_state FROM tether_job_events e WHERE e.job_id = p.id
                             ORDER BY e.id DESC LIMIT 1), 'queued') AS from_state,
                   'running' AS to_state, p.claimed_at AS at, p.claimed_by AS worker_id,
                   'worker' AS actor, NULL AS reason, 0 AS n
            FROM pairs p
            WHERE p.src = 'running' AND p.dst <> 'succeeded' AND p.claimed_at IS NOT NULL
              AND p.id > since_job
              AND NOT EXISTS (SELECT 1 FROM tether_job_events e WHERE e.job_id = p.id
                              AND e.to_state = 'running' AND e.at = p.claimed_at)
            UNION ALL
            SELECT id, src, dst, now(), worker_id, actor, reason, 1 FROM pairs
            WHERE everything OR id <= since_job
               OR NOT (dst = 'running' OR (src = 'running' AND dst = 'succeeded'))
        ) AS rows
        WHERE NOT EXISTS (SELECT 1 FROM bad)
        ORDER BY job_id, n
        RETURNING 1
    ), per_limit AS (
        SELECT name, sum(used)::int AS used, sum(held)::int AS held FROM (
            SELECT unnest(limits) AS name,
                   (dst = 'running')::int - (src = 'running')::int AS used,
                   (dst IN ('paused', 'failed'))::int
                       - (src IN ('paused', 'failed'))::int AS held
            FROM pairs WHERE limits IS NOT NULL
        ) AS per_job
        GROUP BY name
        HAVING sum(used) <> 0 OR sum(held) <> 0
    )
    SELECT (SELECT what FROM bad),
           (SELECT jsonb_object_agg(name, jsonb_build_array(used, held)) FROM per_limit),
           (SELECT array_agg(id ORDER BY id) FROM pairs WHERE dst <> 'running'),
           (SELECT bool_or(dst IN ('queued', 'retrying')) FROM pairs),
           (SELECT bool_or(in_workflow) FROM pairs WHERE dst <> 'running'),
           (SELECT count(*) FROM events)
    INTO bad, deltas, changed, requeued, linked;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'tether: illegal transition %', bad USING ERRCODE = 'check_violation';
    END IF;
    IF deltas IS NOT NULL THEN
        PERFORM tether_limits_apply(deltas);
    END IF;
    -- Transitions other than claims: wake waiters (ids only) if any process listens
    -- for them, and workers when work became claimable; then follow the workflow edges.
    IF changed IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM tether_listeners
                   WHERE channel = 'tether_changed' AND until > now()) THEN
            PERFORM pg_notify('tether_changed', string_agg(id::text, ','))
            FROM (SELECT id, (row_number() OVER () - 1) / 300 AS chunk
                  FROM unnest(changed) AS id) AS numbered
            GROUP BY chunk;
        END IF;
        IF requeued THEN
            PERFORM pg_notify('tether_enqueued', '*');
        END IF;
        IF linked THEN
            PERFORM tether_workflow_step(changed);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- rank: 0 the creation, 1 the other stored transitions, 2 the derived claim of the
-- current run (nothing is stored after it but a success), 3 the success (at most one,
-- and the last: it is terminal). A deleted job's derived transitions are stored before
-- its row goes (DELETE_JOB), after some of its others: the rank keeps them in order.
CREATE VIEW tether_job_history AS
SELECT e.id, e.job_id, e.from_state, e.to_state, e.at, e.worker_id, e.actor, e.reason,
       CASE WHEN e.from_state IS NULL THEN 0 WHEN e.to_state = 'succeeded' THEN 3 ELSE 1 END
           AS rank
FROM tether_job_events e
UNION ALL
SELECT NULL, j.id, NULL, 'queued', j.created_at, NULL, 'enqueue', NULL, 0
FROM tether_jobs j
WHERE j.id > COALESCE((SELECT since_job FROM tether_lighter_history), 0)
  AND NOT EXISTS (SELECT 1 FROM tether_job_events e
                  WHERE e.job_id = j.id AND e.from_state IS NULL)
UNION ALL
SELECT NULL, j.id,
       COALESCE((SELECT e.to_state FROM tether_job_events e
                 WHERE e.job_id = j.id AND e.to_state <> 'succeeded'
                 ORDER BY e.id DESC LIMIT 1), 'queued'),
       'running', j.started_at, j.worker_id, 'worker', NULL, 2
FROM tether_jobs j
WHERE j.state IN ('running', 'succeeded') AND j.started_at IS NOT NULL
  AND j.id > COALESCE((SELECT since_job FROM tether_lighter_history), 0)
  AND NOT EXISTS (SELECT 1 FROM tether_job_events e WHERE e.job_id = j.id
                  AND e.to_state = 'running' AND e.at = j.started_at)
UNION ALL
SELECT NULL, j.id, 'running', 'succeeded', j.finished_at, j.worker_id, j.actor, j.reason, 3
FROM tether_jobs j
WHERE j.state = 'succeeded' AND j.finished_at IS NOT NULL
  AND j.id > COALESCE((SELECT since_job FROM tether_lighter_history), 0)
  AND NOT EXISTS (SELECT 1 FROM tether_job_events e
                  WHERE e.job_id = j.id AND e.to_state = 'succeeded');
