"""Reading jobs and requesting changes to them (see :mod:`tether.store.common.jobs`)."""

from tether.store.rows import CANCEL_STATE, CANCELLABLE_SQL, JOB_COLUMNS
from tether.store.sql.sqlite.fragments import NOW, each

# A page of jobs; ``{where}`` is the filter the shared code builds.
LIST_JOBS = (
    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE {{where}} "
    "ORDER BY id DESC LIMIT :limit OFFSET :offset"
)
COUNT_BY_STATE = "SELECT state, COUNT(*) AS n FROM tether_jobs GROUP BY state"
# A job's transitions, stored and derived (migration 0028), in order.
EVENTS = (
    "SELECT id, job_id, from_state, to_state, at, worker_id, actor, reason "
    "FROM tether_job_history WHERE job_id = :id ORDER BY rank, id"
)

# The control requests: each changes the job and returns it, or returns nothing when
# there is nothing to change. ``announced`` is false: SQLite has no transition trigger
# nor NOTIFY, so the shared code announces the change (hints, after commit).
CANCEL = (
    f"UPDATE tether_jobs SET state = {CANCEL_STATE}, "
    f"finished_at = CASE WHEN state = 'running' THEN finished_at ELSE {NOW} END, "
    f"cancel_requested_at = COALESCE(cancel_requested_at, {NOW}), "
    "cancel_reason = COALESCE(cancel_reason, :reason), "
    "cancel_force = cancel_force OR :force, actor = :actor, reason = :reason, "
    "cancel_cascade = :cascade "
    f"WHERE id = :id AND state IN ({CANCELLABLE_SQL}) RETURNING {JOB_COLUMNS}, 0 AS announced"
)
# An empty reason is no reason here: the job's reason is then 'paused'.
PAUSE = (
    "UPDATE tether_jobs SET "
    "state = CASE WHEN state = 'running' THEN state ELSE 'paused' END, "
    f"pause_requested_at = COALESCE(pause_requested_at, {NOW}), "
    "pause_reason = COALESCE(:reason, pause_reason), actor = :actor, "
    "reason = COALESCE(NULLIF(:reason, ''), 'paused') "
    "WHERE id = :id AND state IN ('queued', 'retrying', 'running') "
    f"RETURNING {JOB_COLUMNS}, 0 AS announced"
)
RESUME = (
    "UPDATE tether_jobs SET "
    "state = CASE WHEN state = 'paused' THEN 'queued' ELSE state END, "
    f"run_at = CASE WHEN state = 'paused' THEN {NOW} ELSE run_at END, "
    "pause_requested_at = NULL, pause_reason = NULL, "
    "budget = COALESCE(:budget, budget), actor = :actor, reason = 'resumed' "
    "WHERE id = :id AND (state = 'paused' OR "
    "(state = 'running' AND pause_requested_at IS NOT NULL)) "
    f"RETURNING {JOB_COLUMNS}, 0 AS announced"
)
RETRY = (
    f"UPDATE tether_jobs SET state = 'queued', attempt = 0, run_at = {NOW}, "
    "finished_at = NULL, cancel_requested_at = NULL, cancel_reason = NULL, "
    "cancel_force = 0, pause_requested_at = NULL, pause_reason = NULL, "
    "actor = :actor, reason = 'retried by a person' "
    f"WHERE id = :id AND state = 'failed' RETURNING {JOB_COLUMNS}, 0 AS announced"
)

# Everything downstream of the jobs (dependents and children, transitively), not
# the jobs themselves.
DOWNSTREAM = (
    "WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(:ids) "
    "UNION SELECT d.job_id FROM tether_dependencies d JOIN reach r "
    "ON d.depends_on = r.id "
    "UNION SELECT c.id FROM tether_jobs c JOIN reach r ON c.parent_id = r.id) "
    f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id IN (SELECT id FROM reach) "
    f"AND id NOT IN {each('ids')} ORDER BY id"
)
UPSTREAM_IDS = "SELECT depends_on AS id FROM tether_dependencies WHERE job_id = :id ORDER BY 1"
DOWNSTREAM_IDS = "SELECT job_id AS id FROM tether_dependencies WHERE depends_on = :id ORDER BY 1"
