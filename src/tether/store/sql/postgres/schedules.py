"""Periodic schedules and the database clock (see :mod:`tether.store.common.schedules`)."""

DB_TIME = "SELECT now() AS now"
# The rows of a worker's schedules that exist, locked; a row someone else holds is
# skipped, never waited for (the worker records it at a later round).
LOCK_SCHEDULES = (
    "SELECT * FROM tether_schedules WHERE name = ANY(%(names)s) ORDER BY name "
    "FOR UPDATE SKIP LOCKED"
)
# DO NOTHING takes no lock on an existing row, so it waits on none either.
INSERT_SCHEDULE = (
    "INSERT INTO tether_schedules (name, task, cron, timezone, last_tick, definition, "
    "defined_at, defined_by) VALUES (%(name)s, %(task)s, %(cron)s, %(timezone)s, %(start)s, "
    "%(definition)s, now(), %(holder)s) ON CONFLICT (name) DO NOTHING RETURNING name"
)
# For a row LOCK_SCHEDULES locked in the same transaction (SKIP LOCKED never skips a
# row this transaction holds; it keeps the statement from waiting on its own anyway).
REDEFINE_SCHEDULE = (
    "UPDATE tether_schedules SET task = %(task)s, cron = %(cron)s, timezone = %(timezone)s, "
    "definition = %(definition)s, defined_at = now(), defined_by = %(holder)s "
    "WHERE name = (SELECT name FROM tether_schedules WHERE name = %(name)s "
    "FOR UPDATE SKIP LOCKED)"
)
# Never back: another scheduler may have dealt with this tick already. A row someone
# holds is skipped, not waited for: the tick's job is enqueued already (idempotently),
# and the next round moves last_tick.
ADVANCE_SCHEDULE = (
    "UPDATE tether_schedules SET last_tick = %(tick)s, next_tick = %(next)s, "
    "last_job_id = COALESCE(%(job)s, last_job_id), "
    "last_run_at = CASE WHEN %(job)s::bigint IS NULL THEN last_run_at ELSE now() END "
    "WHERE name = (SELECT name FROM tether_schedules WHERE name = %(name)s "
    "AND (last_tick IS NULL OR last_tick < %(tick)s) FOR UPDATE SKIP LOCKED)"
)
LIST_SCHEDULES = "SELECT * FROM tether_schedules ORDER BY name"
DECLARED_SCHEDULES = (
    "SELECT d.name, count(*) AS workers FROM tether_workers w, "
    "jsonb_array_elements_text(w.schedules::jsonb) AS d(name) "
    "WHERE w.state IN ('active', 'draining') AND w.schedules IS NOT NULL GROUP BY d.name"
)
SET_SCHEDULE_PAUSED = "UPDATE tether_schedules SET paused = %(paused)s WHERE name = %(name)s"
# A person's command, in a transaction that bounds its wait on a row lock first: the
# leader holds a schedule's row for a moment each round, someone else may hold it for
# longer, and then the command fails ("lock timeout") instead of hanging.
DELETE_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '2s'"
DELETE_SCHEDULE = "DELETE FROM tether_schedules WHERE name = %(name)s"
