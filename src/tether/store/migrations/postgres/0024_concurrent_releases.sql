-- tether schema, version 24 (PostgreSQL): releases that concurrent transactions cannot
-- both miss, an enqueue that holds no lock on a running upstream's row, and rate
-- buckets whose clock never moves back.
--
-- 1. Sibling completions (and two upstreams of one dependent) used to decide a release
--    each from its own snapshot: two children of one parent ending at once each saw the
--    other still running, neither queued the parent, and it stayed blocked for good (a
--    write skew). Now each transaction first locks the rows it may release (the parents
--    of the children that ended, the waiting parents themselves, the blocked dependents
--    of the jobs that succeeded), in id order, and decides in the next statement, whose
--    snapshot is newer than the other transaction's commit. Every row lock of the step
--    (these, and its cascades) is waited for STEP_LOCK_TIMEOUT at most: past it (a
--    foreign transaction holds the row) the step is undone, the transition commits
--    without it, and its jobs go to tether_pending_steps, whose steps the maintenance
--    leader's releaser (maintenance/releaser.py) runs again. The releaser also finds
--    every blocked job whose children or dependencies have all ended, whatever missed it.
--
-- 2. An enqueue with depends_on used to take FOR SHARE on its upstream jobs and set
--    their has_dependents until the caller committed. A transactional enqueue
--    (connection=) could hold that for as long as its caller's transaction lasted, and
--    the upstream's worker could neither beat nor finish. Now the enqueue takes only
--    FOR KEY SHARE (the upstream cannot be deleted meanwhile; updates go on), and the
--    link to the upstream is made at commit by a deferred trigger: it marks the upstream
--    has_dependents under a row lock held only for the commit itself, waiting for an
--    upstream transition in flight, and reads the upstream's state after it. Either the
--    upstream's transition commits first, and this trigger sees it ended and applies its
--    workflow step to the new dependents (queued, or cancelled by the cascade), or the
--    transition waits for this commit, and its own step sees the new dependents.
--
--    The claim, the heartbeat and the rescue lock jobs FOR NO KEY UPDATE (their UPDATE's
--    own mode, where they took FOR UPDATE), which such a FOR KEY SHARE does not block: a
--    claim no longer skips a queued job that an open transaction depends on.
--
-- 3. A paced claim that waited for a bucket's lock refilled it to now(), the start of
--    its transaction, which can be earlier than the refill the previous holder wrote:
--    the bucket's clock moved back and the same interval was credited twice. Now the
--    refill is measured at clock_timestamp() read after the locks are held, and
--    refilled_at never moves back.

-- Workflow steps that met a row held past their lock timeout, to run again by the
-- maintenance leader's releaser (see 1. above).
CREATE TABLE tether_pending_steps (
    job_id BIGINT PRIMARY KEY,
    since  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION tether_workflow_step(changed BIGINT[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    finished_parents BIGINT[];
    roots BIGINT[];
    succeeded BIGINT[];
    linked BOOLEAN;
    stopping BIGINT[];
    targets BIGINT[];
    saved TEXT;
BEGIN
    -- The rows' own flags say which steps have anything to do: a plain job finishing
    -- touches no workflow, and costs one primary-key lookup here.
    SELECT array_agg(id) FILTER (WHERE has_children AND state IN ('succeeded', 'failed')),
           array_agg(id) FILTER (WHERE (has_children OR has_dependents)
                                 AND (state = 'failed' OR (state = 'cancelled' AND cancel_cascade))),
           array_agg(id) FILTER (WHERE has_dependents AND state = 'succeeded'),
           coalesce(bool_or(parent_id IS NOT NULL OR waiting_children), false)
    INTO finished_parents, roots, succeeded, linked
    FROM tether_jobs WHERE id = ANY(changed);
    IF finished_parents IS NULL AND roots IS NULL AND succeeded IS NULL AND NOT linked THEN
        RETURN;
    END IF;

    -- Every row lock below is waited for STEP_LOCK_TIMEOUT at most: another client may
    -- hold a row for any time, and this runs inside a worker's finish, a cancel or a
    -- rescue. Past it, the step is undone and recorded in tether_pending_steps, and the
    -- transition commits without it; the releaser runs it again.
    saved := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '500ms', true);  -- STEP_LOCK_TIMEOUT
    BEGIN
        IF finished_parents IS NOT NULL THEN
            UPDATE tether_jobs c SET state = 'cancelled',
                cancel_requested_at = COALESCE(c.cancel_requested_at, now()),
                cancel_reason = COALESCE(c.cancel_reason, 'parent job completed'),
                lease_token = c.lease_token + (c.state = 'running')::int,
                lease_expires_at = NULL,
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
                    finished_at = CASE WHEN j.state = 'running' THEN j.finished_at
                                       ELSE now() END,
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

        IF succeeded IS NOT NULL OR linked THEN
            -- The jobs this step may release. A parent is locked whatever state this
            -- snapshot shows it in: one that is starting to wait right now looks running
            -- here, and its transition holds the row, so the lock waits for it.
            targets := ARRAY(
                SELECT d.job_id FROM tether_dependencies d JOIN tether_jobs j ON j.id = d.job_id
                WHERE d.depends_on = ANY(succeeded) AND j.state = 'blocked'
                  AND NOT j.waiting_children
                UNION
                SELECT c.parent_id FROM tether_jobs c
                WHERE c.id = ANY(changed) AND c.parent_id IS NOT NULL
                  AND c.state IN ('succeeded', 'failed', 'cancelled')
                UNION
                SELECT p.id FROM tether_jobs p WHERE p.id = ANY(changed) AND p.waiting_children
                ORDER BY 1);
            IF cardinality(targets) > 0 THEN
                PERFORM 1 FROM tether_jobs WHERE id = ANY(targets) ORDER BY id
                FOR NO KEY UPDATE;
                -- Each statement from here reads a snapshot taken after the locks were
                -- granted, so after the commit of any other release attempt on these rows.
                UPDATE tether_jobs j SET state = 'queued', run_at = now(), actor = 'tether',
                    reason = 'dependencies succeeded'
                WHERE j.id = ANY(targets) AND j.state = 'blocked' AND NOT j.waiting_children
                  AND EXISTS (SELECT 1 FROM tether_dependencies d WHERE d.job_id = j.id)
                  AND NOT EXISTS (SELECT 1 FROM tether_dependencies d JOIN tether_jobs up
                                  ON up.id = d.depends_on
                                  WHERE d.job_id = j.id AND up.state <> 'succeeded');
                UPDATE tether_jobs p SET state = 'queued', waiting_children = false,
                    run_at = now(), actor = 'tether',
                    reason = 'children finished; phase ' || COALESCE(p.phase, 'ingest')
                WHERE p.id = ANY(targets) AND p.state = 'blocked' AND p.waiting_children
                  AND NOT EXISTS (SELECT 1 FROM tether_jobs c WHERE c.parent_id = p.id
                                  AND c.state IN ('queued', 'blocked', 'running', 'retrying',
                                                  'paused'));
            END IF;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        INSERT INTO tether_pending_steps (job_id) SELECT DISTINCT unnest(changed)
        ON CONFLICT DO NOTHING;
    END;
    PERFORM set_config('lock_timeout', saved, true);
END
$$;

-- Run at the commit of a transaction that added dependencies (see 2. above), once per
-- upstream job that was not new in the enqueue: the enqueue sets `link` on one of its
-- new dependency rows (an upstream enqueued in the same batch cannot end before it).
ALTER TABLE tether_dependencies ADD COLUMN link BOOLEAN NOT NULL DEFAULT false;

CREATE FUNCTION tether_dependency_added() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    upstream TEXT;
BEGIN
    UPDATE tether_jobs SET has_dependents = true WHERE id = NEW.depends_on AND NOT has_dependents;
    -- FOR SHARE waits for a transition of the upstream in flight and reads its outcome.
    SELECT state INTO upstream FROM tether_jobs WHERE id = NEW.depends_on FOR SHARE;
    IF upstream IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM tether_workflow_step(ARRAY[NEW.depends_on]);
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER tether_dependency_added AFTER INSERT ON tether_dependencies
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.link)
    EXECUTE FUNCTION tether_dependency_added();

CREATE OR REPLACE FUNCTION tether_claim_paced(p_worker TEXT, p_queues TEXT[], p_tasks TEXT[],
                                              p_limit INTEGER, p_lease DOUBLE PRECISION)
RETURNS SETOF tether_jobs LANGUAGE plpgsql AS $$
DECLARE
    buckets TEXT[];
    locked TEXT[];
    have JSONB := '{}';
    b RECORD;
    j tether_jobs;
    taken INTEGER := 0;
    queues TEXT[];
    tasks TEXT[];
    k TEXT;
    at TIMESTAMPTZ;
BEGIN
    -- A worker presumed dead claims nothing: the rescue would take back at once a job
    -- it claimed after being marked (a failover made its session look gone while it
    -- lived). FOR KEY SHARE serialises the claim with the marking, which locks the row
    -- FOR UPDATE: marked first, the claim sees it (or skips the row) and returns
    -- nothing; claimed first, the marking skips the row, and the fresh claim saves the
    -- worker next round. It does not conflict with the heartbeat's row lock. A worker
    -- with no row (a tool, a test) claims as before. One lookup in the usual case.
    PERFORM 1 FROM tether_workers WHERE id = p_worker AND state <> 'dead'
        FOR KEY SHARE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tether_workers WHERE id = p_worker) THEN
        RETURN;
    END IF;
    buckets := ARRAY(SELECT 'queue:' || x FROM unnest(p_queues) AS x)
            || ARRAY(SELECT 'task:' || x FROM unnest(p_tasks) AS x);
    -- Lock first, then read the clock: the refill is measured from the moment this
    -- claim holds the buckets. A bucket someone else holds (another claim in flight, a
    -- caller's transaction, an operator in psql) is skipped, never waited for: its queue
    -- or task gets nothing from this claim, every other one is claimed as usual.
    locked := ARRAY(SELECT id FROM tether_rate_limits WHERE id = ANY(buckets) ORDER BY id
                    FOR UPDATE SKIP LOCKED);
    at := clock_timestamp();
    FOR b IN SELECT id, CASE WHEN id = ANY(locked)
                        THEN least(burst, tokens + greatest(0, extract(epoch FROM at - refilled_at))
                                                   * per_second)
                        ELSE 0 END AS n
             FROM tether_rate_limits WHERE id = ANY(buckets) ORDER BY id
    LOOP
        have := have || jsonb_build_object(b.id, b.n);
    END LOOP;
    IF have = '{}' THEN
        RETURN QUERY SELECT * FROM tether_claim(p_worker, p_queues, p_tasks, p_limit, p_lease);
        RETURN;
    END IF;
    WHILE taken < p_limit LOOP
        -- A bucket with less than one token closes its queue or task for this claim.
        queues := ARRAY(SELECT x FROM unnest(p_queues) AS x
                        WHERE coalesce((have ->> ('queue:' || x))::DOUBLE PRECISION, 1) >= 1);
        tasks := ARRAY(SELECT x FROM unnest(p_tasks) AS x
                       WHERE coalesce((have ->> ('task:' || x))::DOUBLE PRECISION, 1) >= 1);
        EXIT WHEN cardinality(queues) = 0 OR cardinality(tasks) = 0;
        SELECT * INTO j FROM tether_claim(p_worker, queues, tasks, 1, p_lease);
        EXIT WHEN j.id IS NULL;
        taken := taken + 1;
        FOREACH k IN ARRAY ARRAY['queue:' || j.queue, 'task:' || j.task] LOOP
            IF have ? k THEN
                have := have || jsonb_build_object(k, (have ->> k)::DOUBLE PRECISION - 1);
            END IF;
        END LOOP;
        RETURN NEXT j;
    END LOOP;
    -- A bucket's clock never moves back (a server clock stepped back, say): the refill
    -- above counted nothing for the time before refilled_at.
    UPDATE tether_rate_limits r
    SET tokens = greatest(0, (have ->> r.id)::DOUBLE PRECISION),
        refilled_at = greatest(r.refilled_at, at)
    WHERE r.id IN (SELECT jsonb_object_keys(have)) AND r.id = ANY(locked);
END
$$;

-- As version 2's, locking its candidates FOR NO KEY UPDATE (see 2. above). A lease runs
-- from the moment it is granted (clock_timestamp()), not from the transaction's start
-- (now()): a claim that was held up must never hand out a lease already partly spent.
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
        lease_expires_at = clock_timestamp() + make_interval(secs => p_lease),
        heartbeat_at = now(), started_at = now(), result = NULL, stopped_by = NULL,
        actor = 'worker', reason = NULL
    WHERE id = ANY(free_ids)
    RETURNING *;
    IF cardinality(limited_ids) > 0 THEN
        RETURN QUERY SELECT * FROM tether_jobs WHERE id = ANY(limited_ids);
    END IF;
END
$$;

-- A transition's concurrency-limit counts are updated under the limits' row locks. Any
-- client may hold such a row (an operator in psql): the wait is bounded, here where
-- every caller passes (a worker's finish, a rescue, a cancel), unless the caller set a
-- bound of its own. Past it the statement fails with lock_not_available, nothing is
-- written, and the caller tries again (the completer writes that outcome alone).
CREATE OR REPLACE FUNCTION tether_limits_apply(deltas JSONB) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    saved TEXT := current_setting('lock_timeout');
BEGIN
    IF saved = '0' THEN
        PERFORM set_config('lock_timeout', '1s', true);  -- LIMIT_LOCK_TIMEOUT
    END IF;
    PERFORM 1 FROM tether_limits
    WHERE name IN (SELECT jsonb_object_keys(deltas)) ORDER BY name FOR UPDATE;
    PERFORM set_config('lock_timeout', saved, true);
    UPDATE tether_limits l
    SET used = l.used + (deltas -> l.name ->> 0)::int,
        held = l.held + CASE WHEN l.kind = 'key' THEN (deltas -> l.name ->> 1)::int ELSE 0 END
    WHERE l.name IN (SELECT jsonb_object_keys(deltas));
END
$$;
