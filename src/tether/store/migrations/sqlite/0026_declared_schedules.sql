-- tether schema, version 26 (SQLite): every worker declares its app's schedules, and
-- the maintenance leader fires every schedule in this table, declared by any worker.
-- definition: what the leader needs to enqueue a tick without the task's code (a JSON
-- object: cron, time zone, args, missed-tick policy, jitter, grace, and the job as the
-- declaring worker built and checked it); NULL for a row an older version wrote, which
-- fires again once a worker that declares it starts. defined_at / defined_by: when and
-- by which worker the definition was last set (the newest declaration wins).
ALTER TABLE tether_schedules ADD COLUMN definition TEXT;
ALTER TABLE tether_schedules ADD COLUMN defined_at REAL;
ALTER TABLE tether_schedules ADD COLUMN defined_by TEXT;
-- The names of the schedules a worker's app declares (a JSON array), so a schedule that
-- no live worker declares any more can be told apart.
ALTER TABLE tether_workers ADD COLUMN schedules TEXT;
