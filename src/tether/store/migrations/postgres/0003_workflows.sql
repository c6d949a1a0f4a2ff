-- tether schema, version 3 (PostgreSQL): parent/child jobs, two-phase parents and
-- dependencies, with their cascades kept in the same transaction as each transition.

ALTER TABLE tether_jobs
    ADD COLUMN parent_id        BIGINT,
    -- NULL is the first ("ingest") phase.
    ADD COLUMN phase            TEXT,
    -- A blocked parent waiting for its children (not for dependencies).
    ADD COLUMN waiting_children BOOLEAN NOT NULL DEFAULT false,
    -- Whether a cancel request also cancels dependents and children.
    ADD COLUMN cancel_cascade   BOOLEAN NOT NULL DEFAULT true,
    -- Set once a job spawns a child or gains a dependent, so the transition trigger
    -- knows from the row alone whether a transition can touch a workflow at all.
    ADD COLUMN has_children     BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN has_dependents   BOOLEAN NOT NULL DEFAULT false;

CREATE INDEX tether_jobs_parent ON tether_jobs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE tether_dependencies (
    job_id     BIGINT NOT NULL,
    depends_on BIGINT NOT NULL,
    PRIMARY KEY (job_id, depends_on),
    CHECK (job_id <> depends_on)
);
CREATE INDEX tether_dependencies_upstream ON tether_dependencies (depends_on);

-- Every job a cancellation of `roots` reaches: dependents and children, transitively.
CREATE FUNCTION tether_downstream(roots BIGINT[]) RETURNS TABLE (id BIGINT)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE reach(id) AS (
        SELECT unnest(roots)
        UNION
        SELECT x.id FROM reach r CROSS JOIN LATERAL (
            SELECT d.job_id AS id FROM tether_dependencies d WHERE d.depends_on = r.id
            UNION ALL
            SELECT c.id FROM tether_jobs c WHERE c.parent_id IS NOT NULL AND c.parent_id = r.id
        ) AS x
    )
    SELECT id FROM reach WHERE id <> ALL(roots)
$$;

-- The workflow consequences of one statement's transitions, in the same transaction:
--  * a parent that succeeded or failed: its active children are cancelled at once, a
--    running one with its lease revoked, so its late result cannot land;
--  * a job that failed, or was cancelled with cascade: everything downstream that is
--    still active is cancelled (a running job is asked to stop), never resurrected;
--  * a job that succeeded: dependents whose dependencies all succeeded are queued;
--  * a child that ended, or a parent that started waiting: a waiting parent whose
--    children have all ended is queued again for its next phase.
CREATE FUNCTION tether_workflow_step(changed BIGINT[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    finished_parents BIGINT[];
    roots BIGINT[];
    succeeded BIGINT[];
    linked BOOLEAN;
    stopping BIGINT[];
BEGIN
    -- The rows' own flags say which steps have anything to do: a plain job finishing
    -- touches no workflow, and costs one primary-key lookup here.
    SELECT array_agg(id) FILTER (WHERE has_children AND state IN ('succeeded', 'failed')),
           array_agg(id) FILTER (WHERE (has_children OR has_dependents)
                                 AND (state = 'failed' OR (state = 'cancelled' AND cancel_cascade))),
           array_agg(id) FILTER (WHERE has_dependents AND state = 'succeeded'),
           bool_or(parent_id IS NOT NULL OR waiting_children)
    INTO finished_parents, roots, succeeded, linked
    FROM tether_jobs WHERE id = ANY(changed);

    IF finished_parents IS NOT NULL THEN
        UPDATE tether_jobs c SET state = 'cancelled',
            cancel_requested_at = COALESCE(c.cancel_requested_at, now()),
            cancel_reason = COALESCE(c.cancel_reason, 'parent job completed'),
            lease_token = c.lease_token + (c.state = 'running')::int, lease_expires_at = NULL,
            finished_at = now(), actor = 'tether', reason = 'parent job completed'
        WHERE c.parent_id = ANY(finished_parents)
          AND c.state IN ('queued', 'blocked', 'running', 'retrying', 'paused');
    END IF;

    IF roots IS NOT NULL THEN
        WITH hit AS (
            UPDATE tether_jobs j SET
                state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
                cancel_requested_at = COALESCE(j.cancel_requested_at, now()),
                cancel_reason = COALESCE(j.cancel_reason,
                                         'an upstream job was cancelled or failed'),
                finished_at = CASE WHEN j.state = 'running' THEN j.finished_at ELSE now() END,
                actor = 'tether', reason = 'an upstream job was cancelled or failed'
            WHERE j.id IN (SELECT id FROM tether_downstream(roots))
              AND j.state IN ('queued', 'blocked', 'running', 'retrying', 'paused')
            RETURNING j.id, j.state
        )
        SELECT array_agg(id) INTO stopping FROM hit WHERE state = 'running';
        IF stopping IS NOT NULL THEN
            PERFORM pg_notify('tether_control', array_to_string(stopping, ','));
        END IF;
    END IF;

    IF succeeded IS NOT NULL THEN
        UPDATE tether_jobs j SET state = 'queued', run_at = now(), actor = 'tether',
            reason = 'dependencies succeeded'
        WHERE j.state = 'blocked' AND NOT j.waiting_children
          AND j.id IN (SELECT d.job_id FROM tether_dependencies d
                       WHERE d.depends_on = ANY(succeeded))
          AND NOT EXISTS (SELECT 1 FROM tether_dependencies d JOIN tether_jobs up
                          ON up.id = d.depends_on
                          WHERE d.job_id = j.id AND up.state <> 'succeeded');
    END IF;

    IF linked THEN
        UPDATE tether_jobs p SET state = 'queued', waiting_children = false, run_at = now(),
            actor = 'tether', reason = 'children finished; phase ' || COALESCE(p.phase, 'ingest')
        WHERE p.state = 'blocked' AND p.waiting_children
          AND (p.id = ANY(changed)
               OR p.id IN (SELECT c.parent_id FROM tether_jobs c WHERE c.id = ANY(changed)))
          AND NOT EXISTS (SELECT 1 FROM tether_jobs c WHERE c.parent_id = p.id
                          AND c.state IN ('queued', 'blocked', 'running', 'retrying', 'paused'));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION tether_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad TEXT;
    deltas JSONB;
    changed BIGINT[];
    requeued BOOLEAN;
BEGIN
    -- One join of the transition tables, run through EXECUTE so that it is planned for
    -- this statement's row count: a plan cached from a one-row statement would be a
    -- nested loop, quadratic for a cascade that changes thousands of jobs.
    EXECUTE $q$
        WITH pairs AS MATERIALIZED (
            SELECT n.id, o.state AS src, n.state AS dst, n.worker_id, n.actor, n.reason,
                   n.limits
            FROM old_rows o JOIN new_rows n USING (id)
            WHERE o.state <> n.state
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
               (SELECT count(*) FROM events)
    $q$ INTO bad, deltas, changed, requeued;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'tether: illegal transition %', bad USING ERRCODE = 'check_violation';
    END IF;
    IF deltas IS NOT NULL THEN
        PERFORM tether_limits_apply(deltas);
    END IF;
    -- Transitions other than claims: wake waiters (ids only), and workers when work
    -- became claimable; then follow the workflow edges.
    IF changed IS NOT NULL THEN
        PERFORM pg_notify('tether_changed', string_agg(id::text, ','))
        FROM (SELECT id, (row_number() OVER () - 1) / 300 AS chunk
              FROM unnest(changed) AS id) AS numbered
        GROUP BY chunk;
        IF requeued THEN
            PERFORM pg_notify('tether_enqueued', '*');
        END IF;
        PERFORM tether_workflow_step(changed);
    END IF;
    RETURN NULL;
END
$$;
