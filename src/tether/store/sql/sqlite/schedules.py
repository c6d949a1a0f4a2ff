"""Periodic schedules and the database clock (see :mod:`tether.store.common.schedules`).
Times are Unix seconds, here as in the parameters."""

from tether.store.sql.sqlite.fragments import NOW, each

DB_TIME = f"SELECT {NOW} AS now"
# The rows of a worker's schedules that exist. No row locks on SQLite: the write
# transaction keeps everyone else out.
LOCK_SCHEDULES = f"SELECT * FROM tether_schedules WHERE name IN {each('names')}"
INSERT_SCHEDULE = (
    "INSERT INTO tether_schedules (name, task, cron, timezone, last_tick, created_at, "
    "definition, defined_at, defined_by) "
    f"VALUES (:name, :task, :cron, :timezone, :start, {NOW}, :definition, {NOW}, :holder) "
    "ON CONFLICT (name) DO NOTHING RETURNING name"
)
REDEFINE_SCHEDULE = (
    "UPDATE tether_schedules SET task = :task, cron = :cron, timezone = :timezone, "
    f"definition = :definition, defined_at = {NOW}, defined_by = :holder WHERE name = :name"
)
# Never back: another scheduler may have dealt with this tick already.
ADVANCE_SCHEDULE = (
    "UPDATE tether_schedules SET last_tick = :tick, next_tick = :next, "
    "last_job_id = COALESCE(:job, last_job_id), "
    f"last_run_at = CASE WHEN :job IS NULL THEN last_run_at ELSE {NOW} END "
    "WHERE name = :name AND (last_tick IS NULL OR last_tick < :tick)"
)
LIST_SCHEDULES = "SELECT * FROM tether_schedules ORDER BY name"
DECLARED_SCHEDULES = (
    "SELECT d.value AS name, COUNT(*) AS workers FROM tether_workers w, "
    "json_each(w.schedules) d WHERE w.state IN ('active', 'draining') "
    "AND w.schedules IS NOT NULL GROUP BY d.value"
)
SET_SCHEDULE_PAUSED = "UPDATE tether_schedules SET paused = :paused WHERE name = :name"
# No row locks on SQLite: the write lock's busy timeout bounds the wait.
DELETE_LOCK_TIMEOUT = None
DELETE_SCHEDULE = "DELETE FROM tether_schedules WHERE name = :name"
