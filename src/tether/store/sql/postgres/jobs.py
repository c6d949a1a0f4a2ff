"""Reading jobs and requesting changes to them (see :mod:`tether.store.common.jobs`)."""

from tether.store.rows import CANCEL_STATE, CANCELLABLE_SQL, JOB_COLUMNS

# A page of jobs; ``{where}`` is the filter the shared code builds.
LIST_JOBS = (
    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE {{where}} "
    "ORDER BY id DESC LIMIT %(limit)s OFFSET %(offset)s"
)
# The jobs in each state but succeeded are counted in their partial index (migration
# 0027); the succeeded ones are the rest of the table, whose count reads only the
# primary key: both in one snapshot. (Grouping the whole table by state read every row.)
# The rest is MATERIALIZED so that its count runs once, not again for its filter.
COUNT_BY_STATE = """
WITH listed AS MATERIALIZED (
    SELECT state, COUNT(*) AS n FROM tether_jobs WHERE state <> 'succeeded' GROUP BY state
), rest AS MATERIALIZED (
    SELECT (SELECT COUNT(*) FROM tether_jobs)
           - (SELECT COALESCE(SUM(n), 0) FROM listed)::bigint AS n
)
SELECT state, n FROM listed
UNION ALL
SELECT 'succeeded', n FROM rest WHERE n > 0
"""
# A job's transitions, stored and derived (migration 0028), in order.
EVENTS = (
    "SELECT id, job_id, from_state, to_state, at, worker_id, actor, reason "
    "FROM tether_job_history WHERE job_id = %(id)s ORDER BY rank, id"
)

# The cancel request's change alone (deleting a job settles it with this too).
_CANCEL_UPDATE = f"""
UPDATE tether_jobs SET
    state = {CANCEL_STATE},
    finished_at = CASE WHEN state = 'running' THEN finished_at ELSE now() END,
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancel_reason = COALESCE(cancel_reason, %(reason)s),
    cancel_force = cancel_force OR %(force)s, actor = %(actor)s, reason = %(reason)s,
    cancel_cascade = %(cascade)s
WHERE id = %(id)s AND state IN ({CANCELLABLE_SQL})
RETURNING {JOB_COLUMNS}
"""

_PAUSE_UPDATE = f"""
UPDATE tether_jobs SET
    state = CASE WHEN state = 'running' THEN state ELSE 'paused' END,
    pause_requested_at = COALESCE(pause_requested_at, now()),
    pause_reason = COALESCE(%(reason)s, pause_reason), actor = %(actor)s,
    reason = COALESCE(%(reason)s, 'paused')
WHERE id = %(id)s AND state IN ('queued', 'retrying', 'running')
RETURNING {JOB_COLUMNS}
"""

_RESUME_UPDATE = f"""
UPDATE tether_jobs SET
    state = CASE WHEN state = 'paused' THEN 'queued' ELSE state END,
    run_at = CASE WHEN state = 'paused' THEN now() ELSE run_at END,
    pause_requested_at = NULL, pause_reason = NULL, budget = COALESCE(%(budget)s, budget),
    actor = %(actor)s, reason = 'resumed'
WHERE id = %(id)s AND (state = 'paused' OR (state = 'running' AND pause_requested_at IS NOT NULL))
RETURNING {JOB_COLUMNS}
"""

_RETRY_UPDATE = f"""
UPDATE tether_jobs SET state = 'queued', attempt = 0, run_at = now(), finished_at = NULL,
    cancel_requested_at = NULL, cancel_reason = NULL, cancel_force = false,
    pause_requested_at = NULL, pause_reason = NULL,
    actor = %(actor)s, reason = 'retried by a person'
WHERE id = %(id)s AND state = 'failed'
RETURNING {JOB_COLUMNS}
"""


def _announcing(update: str, channel: str) -> str:
    """``update`` and its announcement in one statement, one round trip: the transition
    trigger announces a change of state; a flag on a running job, which the trigger does
    not see, is sent to its worker on ``channel`` here (``n`` is read so that the NOTIFY
    runs). ``announced`` tells the shared code there is nothing left to announce."""
    return (
        f"WITH u AS ({update}), n AS (SELECT pg_notify('{channel}', id::text) "
        "FROM u WHERE state = 'running') "
        "SELECT u.*, (SELECT count(*) FROM n) AS n, TRUE AS announced FROM u"
    )


# The control requests: each changes the job and returns it, or returns nothing when
# there is nothing to change.
CANCEL = _announcing(_CANCEL_UPDATE, "tether_cancel")
PAUSE = _announcing(_PAUSE_UPDATE, "tether_control")
RESUME = _announcing(_RESUME_UPDATE, "tether_control")
RETRY = _announcing(_RETRY_UPDATE, "tether_control")

DOWNSTREAM = (
    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id IN "
    "(SELECT id FROM tether_downstream(%(ids)s::bigint[])) ORDER BY id"
)
UPSTREAM_IDS = "SELECT depends_on AS id FROM tether_dependencies WHERE job_id = %(id)s ORDER BY 1"
DOWNSTREAM_IDS = "SELECT job_id AS id FROM tether_dependencies WHERE depends_on = %(id)s ORDER BY 1"
