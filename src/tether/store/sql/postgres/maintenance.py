"""Dead workers, rescue, the leader's lease and retention (see
:mod:`tether.store.common.maintenance`)."""

from tether.store.rows import JOB_COLUMNS, RESCUE_STATE
from tether.store.sql.postgres.fragments import LIVE_SQL, TERMINAL_SQL

# -- dead workers and rescue ------------------------------------------------------------

LIVE_WORKERS = (
    "SELECT id, pid, pid_start, boot_id, pid_ns, machine_id FROM tether_workers "
    "WHERE state IN ('active', 'draining')"
)
# Every live worker's beat counter and lease, which the rescuers watch (a plain read).
WORKER_BEATS = "SELECT id, beats, lease FROM tether_workers WHERE state IN ('active', 'draining')"
# Only still live: a worker that stopped after LIVE_WORKERS was read stays stopped. Rows
# held by someone else are skipped (the next round tries again): a worker marked dead a
# round later loses nothing, and one held row must not stall the fleet's rescue. The
# full update lock, not the UPDATE's own no-key one: a claim in flight holds its
# worker's row in key-share mode (tether_claim_paced), and a claiming worker is alive.
MARK_DEAD = """
UPDATE tether_workers SET state = 'dead'
WHERE id IN (SELECT id FROM tether_workers WHERE id = ANY(%(ids)s)
             AND state IN ('active', 'draining') FOR UPDATE SKIP LOCKED)
"""
# Workers whose database session is gone, and from whom nothing was heard within the
# grace: neither a heartbeat of the worker nor a claim or heartbeat of one of its jobs.
# After a failover or a server restart every recorded session looks gone, and a
# worker's claimer may get through before its heartbeater (whose backoff is longer): the
# lease it was just granted proves it alive, and must not be rescued from under it.
# %(still)s: the workers the rescuer watched count no beat for the grace on its own
# monotonic clock (NULL: judge by database time alone), so that a server clock stepping
# forward does not declare dead a worker whose beats arrive.
DEAD_SESSIONS = """
UPDATE tether_workers SET state = 'dead'
WHERE id IN (SELECT id FROM tether_workers w
             WHERE state IN ('active', 'draining') AND backend_pid IS NOT NULL
               AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity)
               AND heartbeat_at < now() - make_interval(secs => %(grace)s)
               AND (%(still)s::text[] IS NULL OR id = ANY(%(still)s::text[]))
               AND NOT EXISTS (SELECT 1 FROM tether_jobs j WHERE j.state = 'running'
                               AND j.worker_id = w.id
                               AND j.heartbeat_at >= now() - make_interval(secs => %(grace)s))
             FOR UPDATE SKIP LOCKED)
RETURNING id
"""

RESCUE = f"""
-- A job of a live worker is rescued only once its lease expired AND its worker is
-- "quiet": the caller (the rescuer) watched that worker's beat counter stand still for
-- at least the lease, on its own monotonic clock, and passes (worker: count seen). The
-- worker's row is share-locked (skipped if held: a beat in flight holds it) and
-- must still show that count, so a beat that landed since the caller looked saves its
-- jobs, and one that comes after waits for nothing (it skips the row and is not
-- counted). A step of the server's clock makes leases look expired, but cannot make a
-- worker quiet. A job its worker's last counted beat did not list among the jobs it
-- holds (and older than the beat before) was dropped by a live worker (it fenced itself, or
-- lost track of it): its lease alone decides, as nothing runs it. With quiet NULL (a
-- caller with no history: tests, tools), the lease alone decides, as it does for a job
-- whose worker has no row.
--
-- A worker known dead (process or session gone: marked 'dead'; or 'stopped' with jobs
-- still running) loses its jobs at once. Only workers that stopped within the last
-- hour: the rows of workers long dead (kept until the pruner reaps them) would
-- otherwise be read at every pass. A job of a worker silent for longer has an expired
-- lease anyway, unless its leases outlast an hour, and then the lease's end hands it
-- back.
WITH dead AS (SELECT id FROM tether_workers WHERE state IN ('dead', 'stopped')
              AND heartbeat_at > now() - interval '1 hour'),
quiet AS MATERIALIZED (
    SELECT w.id FROM tether_workers w
    JOIN jsonb_each_text(%(quiet)s::jsonb) AS q(id, beats) ON q.id = w.id
    WHERE w.beats = q.beats::bigint AND w.state IN ('active', 'draining')
    FOR SHARE OF w SKIP LOCKED
)
UPDATE tether_jobs SET state = {RESCUE_STATE},
    lease_token = lease_token + 1, lease_expires_at = NULL,
    -- Recovered work that has a checkpoint goes first: back to its place in line. Other
    -- recovered work goes to the back of the line, behind every job already waiting
    -- (even one stamped with the same instant), so the order never rests on timing.
    run_at = CASE WHEN checkpoint IS NOT NULL THEN LEAST(run_at, created_at)
             ELSE GREATEST(now(), (SELECT max(w.run_at) FROM tether_jobs w
                                   WHERE w.state IN ('queued', 'retrying')
                                   AND w.run_at <= now()) + interval '1 microsecond') END,
    finished_at = CASE WHEN {RESCUE_STATE} IN ({TERMINAL_SQL}) THEN now() ELSE NULL END,
    error = 'worker ' || COALESCE(worker_id, '?') || ' lost its lease (attempt '
            || attempt || '/' || max_attempts || ')',
    actor = 'rescuer',
    -- Smart phase recovery: a later phase without children (the crash came between
    -- the phase change and the spawns) starts again from the first phase.
    phase = CASE WHEN phase IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM tether_jobs c WHERE c.parent_id = tether_jobs.id) THEN NULL
            ELSE phase END,
    reason = CASE WHEN cancel_requested_at IS NOT NULL THEN 'rescued with a pending cancel'
             WHEN pause_requested_at IS NOT NULL THEN 'rescued with a pending pause'
             WHEN worker_id IN (SELECT id FROM dead) THEN 'worker dead'
             ELSE 'lease expired' END
             || CASE WHEN phase IS NULL THEN ''
                WHEN EXISTS (SELECT 1 FROM tether_jobs c WHERE c.parent_id = tether_jobs.id)
                THEN '; staying in phase ' || phase || ' ('
                     || (SELECT count(*) FROM tether_jobs c WHERE c.parent_id = tether_jobs.id)
                     || ' children found)'
                ELSE '; reset to the ingest phase (no children found)' END
-- The candidates: running jobs whose lease expired (through the partial index of running
-- jobs; one pass a second for the fleet, on the maintenance leader), and the running
-- jobs of recently dead workers, looked up by worker. Their rows are then locked in id
-- order (skipping rows held elsewhere) and the conditions checked again.
WHERE id IN (SELECT id FROM tether_jobs
             WHERE id = ANY(ARRAY(
                 SELECT id FROM tether_jobs WHERE state = 'running' AND lease_expires_at < now()
                 UNION ALL
                 -- OFFSET 0 keeps this a lookup per dead worker (of the running jobs'
                 -- index by worker), never a join that reads every running job.
                 SELECT j.id FROM dead, LATERAL (
                     SELECT id FROM tether_jobs
                     WHERE state = 'running' AND worker_id = dead.id OFFSET 0) AS j))
             AND state = 'running'
             AND (worker_id IN (SELECT id FROM dead)
                  OR (lease_expires_at < now()
                      AND (%(quiet)s::jsonb IS NULL OR worker_id IN (SELECT id FROM quiet)
                           OR NOT EXISTS (SELECT 1 FROM tether_workers w
                                          WHERE w.id = tether_jobs.worker_id)
                           -- Dropped by its live worker: its last counted beat did not
                           -- list it among the jobs it holds, and it is older than the
                           -- beat before (a claim may overtake one beat, not two).
                           OR EXISTS (SELECT 1 FROM tether_workers w
                                      WHERE w.id = tether_jobs.worker_id
                                        AND w.holding IS NOT NULL
                                        AND NOT (tether_jobs.id = ANY(w.holding))
                                        AND tether_jobs.heartbeat_at < w.beat_before))))
             -- Rows held by someone else are skipped, not waited for: the next round
             -- tries them again, and the other rescues go ahead now.
             ORDER BY id FOR NO KEY UPDATE SKIP LOCKED)
RETURNING {JOB_COLUMNS}
"""
# The transition trigger NOTIFYs tether_enqueued for the jobs a rescue puts back in line
# (and applies their workflow steps), inside the statement.
RESCUE_NOTIFIES = True

# -- the leader's lease -----------------------------------------------------------------

# Take the lease if it is free or ran out; renew it if it is ours.
LEAD = """
INSERT INTO tether_leaders (name, holder, since, expires_at)
VALUES (%(name)s, %(holder)s, now(), now() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE SET
    since = CASE WHEN tether_leaders.holder = EXCLUDED.holder THEN tether_leaders.since
            ELSE EXCLUDED.since END,
    holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE tether_leaders.holder = EXCLUDED.holder OR tether_leaders.expires_at < now()
"""
LEADER = (
    "SELECT name, holder, since, expires_at, expires_at >= now() AS active "
    "FROM tether_leaders WHERE name = %(name)s"
)
RESIGN = "DELETE FROM tether_leaders WHERE name = %(name)s AND holder = %(holder)s"

# -- retention --------------------------------------------------------------------------

# A failed job (the row j) that holds its concurrency key: it stays until a person acts.
_HOLDS_KEY = """(j.limits IS NOT NULL AND EXISTS (
      SELECT 1 FROM tether_limits l WHERE l.name = ANY(j.limits) AND l.kind = 'key'
      AND l.block_on_hold))"""

_PRUNE_PICK = f"""
SELECT id, finished_at, parent_id IS NOT NULL OR has_children OR has_dependents
       OR EXISTS (SELECT 1 FROM tether_dependencies d WHERE d.job_id = j.id) AS linked
FROM tether_jobs j
WHERE state = %(state)s AND finished_at < now() - make_interval(secs => %(age)s)
  AND NOT (state = 'failed' AND {_HOLDS_KEY})
"""
PRUNE_PICK = _PRUNE_PICK + "ORDER BY state, finished_at, id LIMIT %(limit)s"
PRUNE_PICK_AFTER = (
    _PRUNE_PICK
    + "AND (finished_at, id) > (%(after_at)s, %(after_id)s) "
    + "ORDER BY state, finished_at, id LIMIT %(limit)s"
)
# Added to the pick when it deletes: rows another pruner is deleting are skipped, not
# waited for.
PRUNE_SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"

# The jobs a pruning batch deletes with their rows elsewhere, or counts in a dry run:
# (kind, table, condition on the ids).
PRUNE_TABLES = (
    ("events", "tether_job_events", "job_id = ANY(%(ids)s::bigint[])"),
    (
        "dependencies",
        "tether_dependencies",
        "job_id = ANY(%(ids)s::bigint[]) OR depends_on = ANY(%(ids)s::bigint[])",
    ),
    ("artifacts", "tether_artifacts", "job_id = ANY(%(ids)s::bigint[])"),
    ("steps", "tether_steps", "job_id = ANY(%(ids)s::bigint[])"),
    ("signals", "tether_signals", "job_id = ANY(%(ids)s::bigint[])"),
    ("logs", "tether_job_logs", "job_id = ANY(%(ids)s::bigint[])"),
    ("cancellations", "tether_cancellations", "job_id = ANY(%(ids)s::bigint[])"),
    ("jobs", "tether_jobs", "id = ANY(%(ids)s::bigint[])"),
)

# Every job connected to the seeds through parents, children and dependencies, either way.
_NEIGHBOURS = """
CROSS JOIN LATERAL (
    SELECT j.parent_id AS id FROM tether_jobs j WHERE j.id = r.id AND j.parent_id IS NOT NULL
    UNION ALL SELECT c.id FROM tether_jobs c WHERE c.parent_id = r.id
    UNION ALL SELECT d.depends_on FROM tether_dependencies d WHERE d.job_id = r.id
    UNION ALL SELECT d.job_id FROM tether_dependencies d WHERE d.depends_on = r.id
) AS x
"""

# Those of the ids whose workflow has a member that keeps it: an active one, or a failed
# one that is not prunable itself (younger than %(failed_age)s seconds, any age when it
# is NULL, or holding its concurrency key), for a person may retry it and its next
# attempt reads the others (a fan-in over children). Two walks: everything connected to
# the ids, then everything connected to the keepers found there. Each costs the size of
# the workflows touched, not of the table.
IN_LIVE_WORKFLOW = f"""
WITH RECURSIVE reach(id) AS (
    SELECT unnest(%(ids)s::bigint[])
    UNION SELECT x.id FROM reach r {_NEIGHBOURS}
), live(id) AS (
    SELECT j.id FROM tether_jobs j WHERE j.id IN (SELECT id FROM reach)
        AND (j.state IN ({LIVE_SQL}) OR (j.state = 'failed' AND (
            %(failed_age)s::float8 IS NULL
            OR j.finished_at >= now() - make_interval(secs => %(failed_age)s::float8)
            OR {_HOLDS_KEY})))
    UNION SELECT x.id FROM live r {_NEIGHBOURS}
)
SELECT id FROM live WHERE id = ANY(%(ids)s::bigint[])
"""

# Other rows that retention removes, by kind: (table, the ids of the rows older than
# %(age)s seconds, oldest first).
PRUNE_ROWS = {
    "audit": (
        "tether_audit",
        "SELECT id FROM tether_audit WHERE at < now() - make_interval(secs => %(age)s) ORDER BY at",
    ),
    "workers": (
        "tether_workers",
        "SELECT id FROM tether_workers w WHERE state IN ('stopped', 'dead') "
        "AND heartbeat_at < now() - make_interval(secs => %(age)s) "
        "AND NOT EXISTS (SELECT 1 FROM tether_jobs j WHERE j.state = 'running' "
        "AND j.worker_id = w.id) ORDER BY heartbeat_at",
    ),
}

# -- blocked jobs that wait on something that has already happened ---------------------

# The last blocked job of the next batch after the cursor (NULL: none left), through the
# index by state.
BLOCKED_BATCH = """
SELECT max(id) AS last FROM (
    SELECT id FROM tether_jobs WHERE state = 'blocked' AND id > %(after)s
    ORDER BY id LIMIT %(limit)s
) AS batch
"""

# Those of the batch that wait on something that has already happened, each with the
# job whose workflow step releases it: a parent whose children have all ended (its own
# step), a dependent whose dependencies all succeeded (one of them), a dependent of a
# job that failed or was cancelled with cascade (that job). The transition trigger
# releases these as it goes; this finds what it could not.
STUCK = f"""
SELECT b.id, CASE WHEN b.waiting_children THEN b.id ELSE COALESCE(
    (SELECT min(u.id) FROM tether_dependencies d JOIN tether_jobs u ON u.id = d.depends_on
     WHERE d.job_id = b.id
       AND (u.state = 'failed' OR (u.state = 'cancelled' AND u.cancel_cascade))),
    (SELECT min(d.depends_on) FROM tether_dependencies d WHERE d.job_id = b.id)) END AS step
FROM tether_jobs b
WHERE b.state = 'blocked' AND b.id > %(after)s AND b.id <= %(last)s AND CASE
    WHEN b.waiting_children THEN NOT EXISTS (
        SELECT 1 FROM tether_jobs c WHERE c.parent_id = b.id AND c.state IN ({LIVE_SQL}))
    ELSE EXISTS (SELECT 1 FROM tether_dependencies d WHERE d.job_id = b.id) AND (
        NOT EXISTS (
            SELECT 1 FROM tether_dependencies d JOIN tether_jobs u ON u.id = d.depends_on
            WHERE d.job_id = b.id AND u.state <> 'succeeded')
        OR EXISTS (
            SELECT 1 FROM tether_dependencies d JOIN tether_jobs u ON u.id = d.depends_on
            WHERE d.job_id = b.id
              AND (u.state = 'failed' OR (u.state = 'cancelled' AND u.cancel_cascade))))
    END
ORDER BY b.id
"""

# The workflow steps of these jobs, as their transitions would have run them.
WORKFLOW_STEP = "SELECT tether_workflow_step(%(ids)s::bigint[])"

# Steps that met a row held past their lock timeout (tether_workflow_step records them),
# taken to run again; one that meets a held row again records itself again.
PENDING_STEPS = """
DELETE FROM tether_pending_steps WHERE job_id IN (
    SELECT job_id FROM tether_pending_steps ORDER BY job_id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING job_id
"""
