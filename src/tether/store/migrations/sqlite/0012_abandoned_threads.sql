-- tether schema, version 12 (SQLite): a worker reports the handler threads it has
-- abandoned that still run, and whether they fill its thread pool (it then claims no
-- thread jobs); `tether workers` and the API show both.
ALTER TABLE tether_workers ADD COLUMN abandoned_threads INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tether_workers ADD COLUMN thread_pool_full INTEGER NOT NULL DEFAULT 0;
