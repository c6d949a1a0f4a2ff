-- tether schema, version 29 (PostgreSQL): a claim is dated when it takes effect.
--
-- A job's started_at was the claim transaction's now(), the moment its statement began.
-- tether_claim is one statement of several inner ones, and an inner one may see a
-- transition that committed after that moment: the finish of the job that held the same
-- key, say. The next job of the key then read as started before the last one finished,
-- though it never overlapped it. started_at is now the clock when the row is claimed
-- (clock_timestamp(), as the lease's expiry already was), so it is never earlier than
-- the commit of anything the claim saw.
--
-- The stored claim event (written while a feed follows, or for a job from before 0028)
-- takes the same time, the new row's started_at, so that a stored claim and the one
-- tether_job_history derives from the row stay the same transition.

CREATE OR REPLACE FUNCTION tether_claim(p_worker TEXT, p_queues TEXT[], p_tasks TEXT[],
                                        p_limit INTEGER, p_lease DOUBLE PRECISION)
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
        FOR NO KEY UPDATE OF j SKIP LOCKED
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
                    lease_expires_at = clock_timestamp() + make_interval(secs => p_lease),
                    heartbeat_at = now(), started_at = clock_timestamp(), result = NULL,
                    stopped_by = NULL,
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
        lease_expires_at = clock_timestamp() + make_interval(secs => p_lease),
        heartbeat_at = now(), started_at = clock_timestamp(), result = NULL,
        stopped_by = NULL,
        actor = 'worker', reason = NULL
    WHERE id = ANY(free_ids)
    RETURNING *;
    IF cardinality(limited_ids) > 0 THEN
        RETURN QUERY SELECT * FROM tether_jobs WHERE id = ANY(limited_ids);
    END IF;
END
$$;

-- As version 28's; a claim's event is dated by the row's started_at (see above).
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
               max(claimed_by) AS claimed_by, max(began_at) AS began_at
        FROM (
            SELECT id, state AS src, NULL::text AS dst, NULL::text AS worker_id,
                   NULL::text AS actor, NULL::text AS reason, NULL::text[] AS limits,
                   NULL::boolean AS in_workflow, started_at AS claimed_at,
                   worker_id AS claimed_by, NULL::timestamptz AS began_at
            FROM old_rows
            UNION ALL
            SELECT id, NULL, state, worker_id, actor, reason, limits,
                   has_children OR has_dependents OR parent_id IS NOT NULL OR waiting_children,
                   NULL::timestamptz, NULL::text, started_at
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
            SELECT id, src, dst, CASE WHEN dst = 'running' THEN began_at ELSE now() END,
                   worker_id, actor, reason, 1
            FROM pairs
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
