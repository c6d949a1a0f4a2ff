-- tether schema, version 10 (PostgreSQL): where a worker's pid means something (its
-- kernel boot, PID namespace and machine), so that a pid is checked only from the same
-- place.
ALTER TABLE tether_workers
    ADD COLUMN boot_id TEXT,
    ADD COLUMN pid_ns TEXT,
    ADD COLUMN machine_id TEXT;
