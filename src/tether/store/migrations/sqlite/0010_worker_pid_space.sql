-- tether schema, version 10 (SQLite): where a worker's pid means something (its kernel
-- boot, PID namespace and machine), so that a pid is checked only from the same place.
ALTER TABLE tether_workers ADD COLUMN boot_id TEXT;
ALTER TABLE tether_workers ADD COLUMN pid_ns TEXT;
ALTER TABLE tether_workers ADD COLUMN machine_id TEXT;
