"""Periodic schedules and the database clock (see :mod:`tether.store.common.schedules`)."""

DB_TIME = "SELECT now() AS now"
SYNC_SCHEDULE = (
    "INSERT INTO tether_schedules (name, task, cron, timezone, last_tick) "
    "VALUES (%(name)s, %(task)s, %(cron)s, %(timezone)s, %(start)s) ON CONFLICT (name) DO UPDATE "
    "SET task = EXCLUDED.task, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone "
    "RETURNING *"
)
# Never back: another scheduler may have dealt with this tick already.
ADVANCE_SCHEDULE = (
    "UPDATE tether_schedules SET last_tick = %(tick)s, next_tick = %(next)s, "
    "last_job_id = COALESCE(%(job)s, last_job_id), "
    "last_run_at = CASE WHEN %(job)s::bigint IS NULL THEN last_run_at ELSE now() END "
    "WHERE name = %(name)s AND (last_tick IS NULL OR last_tick < %(tick)s)"
)
LIST_SCHEDULES = "SELECT * FROM tether_schedules ORDER BY name"
SET_SCHEDULE_PAUSED = "UPDATE tether_schedules SET paused = %(paused)s WHERE name = %(name)s"
