"""Periodic schedules and the database clock (see :mod:`tether.store.common.schedules`).
Times are Unix seconds, here as in the parameters."""

from tether.store.sql.sqlite.fragments import NOW

DB_TIME = f"SELECT {NOW} AS now"
SYNC_SCHEDULE = (
    "INSERT INTO tether_schedules (name, task, cron, timezone, last_tick, created_at) "
    f"VALUES (:name, :task, :cron, :timezone, :start, {NOW}) ON CONFLICT (name) DO UPDATE "
    "SET task = excluded.task, cron = excluded.cron, timezone = excluded.timezone "
    "RETURNING *"
)
# Never back: another scheduler may have dealt with this tick already.
ADVANCE_SCHEDULE = (
    "UPDATE tether_schedules SET last_tick = :tick, next_tick = :next, "
    "last_job_id = COALESCE(:job, last_job_id), "
    f"last_run_at = CASE WHEN :job IS NULL THEN last_run_at ELSE {NOW} END "
    "WHERE name = :name AND (last_tick IS NULL OR last_tick < :tick)"
)
LIST_SCHEDULES = "SELECT * FROM tether_schedules ORDER BY name"
SET_SCHEDULE_PAUSED = "UPDATE tether_schedules SET paused = :paused WHERE name = :name"
