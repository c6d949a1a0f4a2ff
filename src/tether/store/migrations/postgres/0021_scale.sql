-- tether schema, version 21 (PostgreSQL): coordination whose cost does not grow with
-- the fleet.
--
-- A NOTIFY makes its commit take a server-wide lock, so every notifying commit waits for
-- the others; and every session that LISTENs on the channel reads every notification.
-- Version 5 notified 'tether_changed' on every transition, which only waiters for job
-- results, cancellation waits and the live feed use. Now a process that listens there
-- says so in tether_listeners (renewing a row that runs out), and transitions notify
-- only while one does. Workers listen only on the channels they use.
CREATE TABLE tether_listeners (
    channel TEXT PRIMARY KEY,
    until   TIMESTAMPTZ NOT NULL
);

-- The dead-worker check reads only live workers, not every worker row ever seen. (The
-- rescue, once a second on the maintenance leader, reads the running jobs through
-- their partial index of version 1. An index on lease_expires_at would spare it that,
-- but every heartbeat changes that column: its updates could no longer be HOT, and
-- each beat would write an entry into every index of tether_jobs, which measured twice
-- the WAL of long jobs.)
CREATE INDEX tether_workers_state ON tether_workers (state, host);

CREATE OR REPLACE FUNCTION tether_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad TEXT;
    deltas JSONB;
    changed BIGINT[];
    requeued BOOLEAN;
    linked BOOLEAN;
BEGIN
    WITH pairs AS MATERIALIZED (
        -- Each id appears once in old_rows and once in new_rows; only the new row
        -- fills the columns after src.
        SELECT id, max(src) AS src, max(dst) AS dst, max(worker_id) AS worker_id,
               max(actor) AS actor, max(reason) AS reason, max(limits) AS limits,
               bool_or(in_workflow) AS in_workflow
        FROM (
            SELECT id, state AS src, NULL::text AS dst, NULL::text AS worker_id,
                   NULL::text AS actor, NULL::text AS reason, NULL::text[] AS limits,
                   NULL::boolean AS in_workflow
            FROM old_rows
            UNION ALL
            SELECT id, NULL, state, worker_id, actor, reason, limits,
                   has_children OR has_dependents OR parent_id IS NOT NULL OR waiting_children
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
        INSERT INTO tether_job_events (job_id, from_state, to_state, worker_id, actor, reason)
        SELECT id, src, dst, worker_id, actor, reason FROM pairs
        WHERE NOT EXISTS (SELECT 1 FROM bad)
        ORDER BY id
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
