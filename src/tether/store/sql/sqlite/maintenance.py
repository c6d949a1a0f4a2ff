"""Dead workers, rescue, the leader's lease and retention (see
:mod:`tether.store.common.maintenance`)."""

from tether.store.rows import JOB_COLUMNS, RESCUE_STATE
from tether.store.sql.sqlite.fragments import LIVE_SQL, NOW, TERMINAL_SQL, each

# -- dead workers and rescue ------------------------------------------------------------

LIVE_WORKERS = (
    "SELECT id, pid, pid_start, boot_id, pid_ns, machine_id FROM tether_workers "
    "WHERE state IN ('active', 'draining')"
)
# Every live worker's beat counter and lease, which the rescuers watch (a plain read).
WORKER_BEATS = "SELECT id, beats, lease FROM tether_workers WHERE state IN ('active', 'draining')"
MARK_DEAD = (
    f"UPDATE tether_workers SET state = 'dead' WHERE id IN {each('ids')} "
    "AND state IN ('active', 'draining')"
)
# No sessions to look at on SQLite: a worker elsewhere is judged by lease expiry.
DEAD_SESSIONS = None

# Known dead: the process is gone ('dead'), or the worker stopped with jobs running.
_DEAD = "SELECT id FROM tether_workers WHERE state IN ('dead', 'stopped')"
# The conditions are PostgreSQL's RESCUE (see there): a job of a live worker goes back
# only once its lease expired and the caller watched its worker's beat counter stand
# still for a lease on its own monotonic clock (:quiet, {worker: count seen}), so a
# process whose clock jumps ahead cannot rescue a worker whose beats still arrive. No
# row locks here: the write transaction serializes the rescue with every beat.
_HAS_CHILDREN = "EXISTS (SELECT 1 FROM tether_jobs c WHERE c.parent_id = tether_jobs.id)"
# INDEXED BY: once the table is mostly finished jobs, ANALYZE's statistics (one value of
# `state` for nearly every row) make the planner scan the whole table for the few running
# jobs, every second (129 ms at 1,000,000 rows, against 0.3 ms through the index).
RESCUE = (
    "UPDATE tether_jobs INDEXED BY tether_jobs_running "
    f"SET state = {RESCUE_STATE}, "
    "lease_token = lease_token + 1, lease_expires_at = NULL, "
    # Recovered work that has a checkpoint goes first: back to its place in line.
    # Other recovered work goes to the back of the line: behind every job
    # already waiting, even one enqueued within the same tick of the clock
    # (SQLite's clock counts milliseconds), so the order never rests on timing.
    f"run_at = CASE WHEN checkpoint IS NOT NULL THEN MIN(run_at, created_at) "
    f"ELSE MAX({NOW}, COALESCE((SELECT MAX(w.run_at) FROM tether_jobs w "
    f"WHERE w.state IN ('queued', 'retrying') AND w.run_at <= {NOW}), 0) + 0.001) "
    "END, "
    f"finished_at = CASE WHEN {RESCUE_STATE} IN ({TERMINAL_SQL}) THEN {NOW} "
    "ELSE NULL END, "
    "error = 'worker ' || COALESCE(worker_id, '?') || ' lost its lease (attempt ' "
    "|| attempt || '/' || max_attempts || ')', actor = 'rescuer', "
    "reason = CASE WHEN cancel_requested_at IS NOT NULL "
    "THEN 'rescued with a pending cancel' "
    "WHEN pause_requested_at IS NOT NULL THEN 'rescued with a pending pause' "
    f"WHEN worker_id IN ({_DEAD}) THEN 'worker dead' ELSE 'lease expired' END "
    f"|| CASE WHEN phase IS NULL THEN '' WHEN {_HAS_CHILDREN} "
    "THEN '; staying in phase ' || phase || ' (' || (SELECT COUNT(*) FROM "
    "tether_jobs c WHERE c.parent_id = tether_jobs.id) || ' children found)' "
    "ELSE '; reset to the ingest phase (no children found)' END, "
    # Smart phase recovery: a later phase without children (the crash came
    # between the phase change and the spawns) starts again from the first.
    f"phase = CASE WHEN phase IS NOT NULL AND NOT {_HAS_CHILDREN} THEN NULL "
    "ELSE phase END "
    f"WHERE state = 'running' AND (worker_id IN ({_DEAD}) OR (lease_expires_at < {NOW} "
    "AND (:quiet IS NULL OR worker_id IN (SELECT w.id FROM tether_workers w "
    "JOIN json_each(:quiet) AS q ON q.key = w.id WHERE w.beats = q.value "
    "AND w.state IN ('active', 'draining')) "
    "OR worker_id NOT IN (SELECT id FROM tether_workers) "
    # Dropped by its live worker (see PostgreSQL's RESCUE).
    "OR EXISTS (SELECT 1 FROM tether_workers w WHERE w.id = tether_jobs.worker_id "
    "AND w.holding IS NOT NULL AND tether_jobs.heartbeat_at < w.beat_before "
    "AND tether_jobs.id NOT IN (SELECT value FROM json_each(w.holding)))))) "
    f"RETURNING {JOB_COLUMNS}"
)
# Nothing announces the jobs a rescue puts back in line: the store does, after commit.
RESCUE_NOTIFIES = False

# -- the leader's lease -----------------------------------------------------------------

# Take the lease if it is free or ran out; renew it if it is ours.
LEAD = (
    "INSERT INTO tether_leaders (name, holder, since, expires_at) "
    f"VALUES (:name, :holder, {NOW}, {NOW} + :ttl) ON CONFLICT (name) DO UPDATE SET "
    "since = CASE WHEN holder = excluded.holder THEN since ELSE excluded.since END, "
    "holder = excluded.holder, expires_at = excluded.expires_at "
    "WHERE holder = excluded.holder OR expires_at < excluded.since"
)
LEADER = (
    f"SELECT name, holder, since, expires_at, expires_at >= {NOW} AS active "
    "FROM tether_leaders WHERE name = :name"
)
RESIGN = "DELETE FROM tether_leaders WHERE name = :name AND holder = :holder"

# -- retention --------------------------------------------------------------------------

_PRUNE_PICK = (
    "SELECT id, finished_at, parent_id IS NOT NULL OR has_children "
    "OR has_dependents OR EXISTS (SELECT 1 FROM tether_dependencies d "
    "WHERE d.job_id = tether_jobs.id) AS linked FROM tether_jobs "
    f"WHERE state = :state AND finished_at < {NOW} - :age "
)

# A failed job (the row {j}) that holds its concurrency key: it stays until a person acts.
_HOLDS_KEY = (
    "({j}.limits IS NOT NULL AND EXISTS (SELECT 1 FROM json_each({j}.limits) e "
    "JOIN tether_limits l ON l.name = e.value WHERE l.kind = 'key' AND l.block_on_hold))"
)
_PRUNE_ORDER = (
    f"AND NOT (state = 'failed' AND {_HOLDS_KEY.format(j='tether_jobs')}) "
    "ORDER BY state, finished_at, id LIMIT :limit"
)
PRUNE_PICK = _PRUNE_PICK + _PRUNE_ORDER
PRUNE_PICK_AFTER = _PRUNE_PICK + "AND (finished_at, id) > (:after_at, :after_id) " + _PRUNE_ORDER
# No row locks on SQLite: the write transaction keeps other pruners out.
PRUNE_SKIP_LOCKED = ""

# The jobs a pruning batch deletes with their rows elsewhere, or counts in a dry run:
# (kind, table, condition on the ids).
PRUNE_TABLES = (
    ("events", "tether_job_events", f"job_id IN {each('ids')}"),
    (
        "dependencies",
        "tether_dependencies",
        f"job_id IN {each('ids')} OR depends_on IN {each('ids')}",
    ),
    ("artifacts", "tether_artifacts", f"job_id IN {each('ids')}"),
    ("steps", "tether_steps", f"job_id IN {each('ids')}"),
    ("signals", "tether_signals", f"job_id IN {each('ids')}"),
    ("logs", "tether_job_logs", f"job_id IN {each('ids')}"),
    ("cancellations", "tether_cancellations", f"job_id IN {each('ids')}"),
    ("jobs", "tether_jobs", f"id IN {each('ids')}"),
)

# Every job connected to the seeds through parents, children and dependencies, either way.
_REACH = """
    UNION SELECT j.parent_id FROM tether_jobs j JOIN {cte} r ON j.id = r.id
        WHERE j.parent_id IS NOT NULL
    UNION SELECT c.id FROM tether_jobs c JOIN {cte} r ON c.parent_id = r.id
    UNION SELECT d.depends_on FROM tether_dependencies d JOIN {cte} r ON d.job_id = r.id
    UNION SELECT d.job_id FROM tether_dependencies d JOIN {cte} r ON d.depends_on = r.id
"""

# Those of the ids whose workflow (the jobs connected to them) has a member that keeps
# it: an active one, or a failed one that is not prunable itself (younger than
# :failed_age seconds, any age when it is NULL, or holding its concurrency key), for a
# person may retry it and its next attempt reads the others (a fan-in over children).
# Two walks: first everything connected to the ids, then, from the keepers found there,
# everything connected to those: the ids reached last are kept. Each walk costs the
# size of the workflows touched, not of the table.
IN_LIVE_WORKFLOW = (
    f"WITH RECURSIVE reach(id) AS (SELECT value FROM json_each(:ids) "
    f"{_REACH.format(cte='reach')}"
    f"), live(id) AS (SELECT j.id FROM tether_jobs j WHERE j.id IN (SELECT id FROM reach) "
    f"AND (j.state IN ({LIVE_SQL}) OR (j.state = 'failed' AND (:failed_age IS NULL "
    f"OR j.finished_at >= {NOW} - :failed_age OR {_HOLDS_KEY.format(j='j')}))) "
    f"{_REACH.format(cte='live')}) "
    "SELECT value AS id FROM json_each(:ids) WHERE value IN (SELECT id FROM live)"
)

# Other rows that retention removes, by kind: (table, the ids of the rows older than
# :age seconds, oldest first).
PRUNE_ROWS = {
    "audit": ("tether_audit", f"SELECT id FROM tether_audit WHERE at < {NOW} - :age ORDER BY at"),
    "workers": (
        "tether_workers",
        "SELECT id FROM tether_workers w WHERE state IN ('stopped', 'dead') "
        f"AND heartbeat_at < {NOW} - :age AND NOT EXISTS (SELECT 1 FROM tether_jobs j "
        "WHERE j.state = 'running' AND j.worker_id = w.id) ORDER BY heartbeat_at",
    ),
}

# -- blocked jobs that wait on something that has already happened ---------------------

# As PostgreSQL's (see there).
BLOCKED_BATCH = """
SELECT max(id) AS last FROM (
    SELECT id FROM tether_jobs WHERE state = 'blocked' AND id > :after
    ORDER BY id LIMIT :limit
) AS batch
"""

STUCK = f"""
SELECT b.id, CASE WHEN b.waiting_children THEN b.id ELSE COALESCE(
    (SELECT min(u.id) FROM tether_dependencies d JOIN tether_jobs u ON u.id = d.depends_on
     WHERE d.job_id = b.id
       AND (u.state = 'failed' OR (u.state = 'cancelled' AND u.cancel_cascade))),
    (SELECT min(d.depends_on) FROM tether_dependencies d WHERE d.job_id = b.id)) END AS step
FROM tether_jobs b
WHERE b.state = 'blocked' AND b.id > :after AND b.id <= :last AND CASE
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

# SQLite runs workflow steps in Python (the store's _after_transitions), under the
# write lock: no step waits for a row, none is left pending.
WORKFLOW_STEP = None
PENDING_STEPS = None
