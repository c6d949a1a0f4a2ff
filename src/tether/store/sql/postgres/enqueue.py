"""Creating jobs: enqueue, spawn and delete (see :mod:`tether.store.common.enqueue`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.store.rows import CANCEL_STATE, CANCELLABLE_SQL, JOB_COLUMNS

# Concurrent batches sharing idempotency keys in different orders would deadlock on the
# unique index; taking a lock per key in one global order first makes them queue instead.
_KEY_LOCK_SPACE = 0x7E7E  # first key of the per-idempotency-key advisory locks
LOCK_KEYS = f"""
SELECT pg_advisory_xact_lock({_KEY_LOCK_SPACE}, h) FROM (
    SELECT DISTINCT hashtext(k) AS h FROM unnest(%(keys)s::text[]) AS k
) AS keys ORDER BY h
"""

# TAKEN_KEYS lets the keys go itself, in the same round trip.
RELEASE_KEYS = None

# The jobs that hold the keys, with the key as stored (never pending here: a PostgreSQL
# enqueue commits at once). A key whose uniqueness window has passed is let go by its old
# job first, so that this enqueue creates a new one (run under the keys' locks, before
# the insert); the SELECT reads the rows as they were before that UPDATE, so the jobs
# it released are left out by id.
TAKEN_KEYS = f"""
WITH released AS (
    UPDATE tether_jobs SET idempotency_key = NULL
    WHERE idempotency_key = ANY(%(keys)s) AND idempotency_expires_at <= now()
    RETURNING id
)
SELECT idempotency_key, false AS pending, {JOB_COLUMNS} FROM tether_jobs
WHERE idempotency_key = ANY(%(keys)s) AND id NOT IN (SELECT id FROM released)
"""

# Ids for the new jobs, drawn before anything is written, so that the dependencies on
# earlier entries of the batch are known first.
NEW_IDS = "SELECT nextval('tether_jobs_id_seq') FROM generate_series(1, %(n)s)"

# A key-share lock: an upstream job cannot be deleted (nor pruned) before our commit; its
# heartbeat, its outcome and any other update go on. That it cannot end unseen is the
# deferred trigger's work (tether_dependency_added, migration 0024): at commit it marks
# the upstream has_dependents and, if it ended meanwhile, applies its workflow step to
# the new dependents. A caller's transaction (connection=) may stay open for long, so
# nothing here may hold a lock that a worker's update of the upstream waits for. It
# waits only on a full update lock (a person's bounded delete, an operator in psql): an
# enqueue is its caller's own statement, bounded by the caller's deadline, never a
# background one.
DEPENDENCY_STATES = "SELECT id, state FROM tether_jobs WHERE id = ANY(%(ids)s) FOR KEY SHARE"

# Every enqueue, one statement for the whole batch. Jobs whose ids were drawn already
# (see NEW_IDS) arrive with them; the others take theirs here, in row order. The key's
# unique index is partial (no NULL keys, migration 0027): the conflict target names its
# predicate, or the insert would find no index to arbitrate on.
_INSERT_JOBS = f"""
INSERT INTO tether_jobs (id, task, args, queue, priority, key, state, max_attempts, timeout,
                         run_at, owner, idempotency_key, actor, budget, limits, parent_id,
                         has_dependents, idempotency_expires_at, meta)
SELECT COALESCE(i, nextval('tether_jobs_id_seq')), t, a::jsonb, q, p, k, st, m, tmo,
       COALESCE(ra, now() + make_interval(secs => d)), o, ik, 'enqueue', b,
       CASE WHEN l IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(l::jsonb))
       END, par, hd, now() + make_interval(secs => uf), mt::jsonb
FROM unnest(%(i)s::bigint[], %(t)s::text[], %(a)s::text[], %(q)s::text[], %(p)s::int[],
            %(k)s::text[], %(st)s::text[], %(m)s::int[], %(tmo)s::float8[], %(d)s::float8[],
            %(o)s::text[], %(ik)s::text[], %(b)s::bigint[], %(l)s::text[], %(par)s::bigint[],
            %(hd)s::boolean[], %(ra)s::timestamptz[], %(uf)s::float8[], %(mt)s::text[])
     AS x(i, t, a, q, p, k, st, m, tmo, d, o, ik, b, l, par, hd, ra, uf, mt)
{{conflict}}RETURNING idempotency_key, {JOB_COLUMNS}
"""
INSERT_JOBS = _INSERT_JOBS.format(
    conflict="ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING\n"
)
# A batch without idempotency keys cannot conflict: a plain insert spares each row the
# speculative insertion's second WAL record (its confirmation).
INSERT_KEYLESS_JOBS = _INSERT_JOBS.format(conflict="")
_INSERT_COLUMNS = (
    *("i", "t", "a", "q", "p", "k", "st", "m", "tmo"),
    *("d", "o", "ik", "b", "l", "par", "hd", "ra", "uf", "mt"),
)


def job_rows(rows: Sequence[Sequence[Any]]) -> dict[str, list[Any]]:
    """:data:`INSERT_JOBS`'s parameters: one array per column of the rows
    (:meth:`~tether.store.common.enqueue.EnqueueSql._job_row`)."""
    cols: list[list[Any]] = [[] for _ in _INSERT_COLUMNS]
    for row in rows:
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    # float8[] columns: psycopg refuses a list mixing int and float.
    for at in (8, 9, 17):
        cols[at] = [None if v is None else float(v) for v in cols[at]]
    return dict(zip(_INSERT_COLUMNS, cols, strict=True))


# One row per upstream job not of this enqueue has `link` set: its deferred trigger
# (tether_dependency_added) links that upstream at commit, for all its new dependents.
INSERT_DEPENDENCIES = """
INSERT INTO tether_dependencies (job_id, depends_on, link)
SELECT j, d, d = ANY(%(outside)s::bigint[]) AND row_number() OVER (PARTITION BY d ORDER BY j) = 1
FROM unnest(%(job_ids)s::bigint[], %(depends_on)s::bigint[]) AS x(j, d)
"""


def dependency_rows(
    pairs: Sequence[tuple[int, int]], outside: Sequence[int]
) -> dict[str, list[int]]:
    """:data:`INSERT_DEPENDENCIES`'s parameters, from (job, the job it depends on) and
    the upstream jobs not of this enqueue."""
    return {
        "job_ids": [a for a, _ in pairs],
        "depends_on": [b for _, b in pairs],
        "outside": list(outside),
    }


# Done at commit by the deferred trigger tether_dependency_added (see DEPENDENCY_STATES).
MARK_UPSTREAM = None

SPAWN = f"""
INSERT INTO tether_jobs (task, args, queue, priority, key, state, max_attempts, timeout, run_at,
                         owner, idempotency_key, actor, budget, limits, parent_id, meta)
SELECT %(task)s, %(args)s::jsonb, %(queue)s, %(priority)s, %(key)s, 'queued',
       %(max_attempts)s, %(timeout)s, now() + make_interval(secs => %(delay)s), p.owner,
       %(idem)s, 'spawn', %(budget)s, %(limits)s::text[], p.id, %(meta)s::jsonb
FROM tether_jobs p
-- Fenced by the parent's lease: a cancelled, deleted or rescued parent cannot spawn.
WHERE p.id = %(parent)s AND p.lease_token = %(token)s AND p.state = 'running'
  AND p.cancel_requested_at IS NULL
RETURNING {JOB_COLUMNS}
"""

MARK_PARENT = "UPDATE tether_jobs SET has_children = true WHERE id = %(id)s AND NOT has_children"

# The job to delete, locked until the transaction ends. A person's delete must wait for
# the row (it must see the job's last state), so it is bounded: delete runs under
# SqlBase._transact_bounded (lock_timeout, then RowLocked: "try again").
DELETING = (
    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id = %(id)s "
    "FOR UPDATE  -- waits, bounded: run only under SqlBase._transact_bounded (see above)"
)

CANCEL_CHILDREN = f"""
UPDATE tether_jobs SET state = 'cancelled',
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancel_reason = COALESCE(cancel_reason, 'parent job deleted'),
    lease_token = lease_token + (state = 'running')::int, lease_expires_at = NULL,
    finished_at = now(), actor = %(actor)s, reason = 'parent job deleted'
WHERE parent_id = %(id)s AND state IN ('queued', 'blocked', 'running', 'retrying', 'paused')
RETURNING {JOB_COLUMNS}
"""

# The deleted job settles as a forced cascading cancel request would, and a running one
# is then cancelled at once: two statements, as one cannot change a row twice.
SETTLE_DELETED = (
    f"""
UPDATE tether_jobs SET
    state = {CANCEL_STATE},
    finished_at = CASE WHEN state = 'running' THEN finished_at ELSE now() END,
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancel_reason = COALESCE(cancel_reason, 'job deleted'),
    cancel_force = true, actor = %(actor)s, reason = 'job deleted', cancel_cascade = true
WHERE id = %(id)s AND state IN ({CANCELLABLE_SQL})
""",
    "UPDATE tether_jobs SET state = 'cancelled', lease_token = lease_token + 1, "
    "lease_expires_at = NULL, finished_at = now(), actor = %(actor)s, reason = 'job deleted' "
    "WHERE id = %(id)s AND state = 'running'",
)

# A deleted job's history stays (the feed and `job show` read it): the transitions its
# row gave (migration 0028) are stored first, in order.
DELETE_JOB = (
    "INSERT INTO tether_job_events (job_id, from_state, to_state, at, worker_id, actor, "
    "reason) SELECT job_id, from_state, to_state, at, worker_id, actor, reason "
    "FROM tether_job_history WHERE job_id = %(id)s AND id IS NULL ORDER BY rank",
    "DELETE FROM tether_dependencies WHERE job_id = %(id)s",
    "DELETE FROM tether_artifacts WHERE job_id = %(id)s",
    "DELETE FROM tether_steps WHERE job_id = %(id)s",
    "DELETE FROM tether_signals WHERE job_id = %(id)s",
    "DELETE FROM tether_job_logs WHERE job_id = %(id)s",
    "DELETE FROM tether_jobs WHERE id = %(id)s",
)
