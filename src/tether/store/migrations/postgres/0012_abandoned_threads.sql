-- tether schema, version 12 (PostgreSQL): a worker reports the handler threads it has
-- abandoned that still run, and whether they fill its thread pool (it then claims no
-- thread jobs); `tether workers` and the API show both.
ALTER TABLE tether_workers
    ADD COLUMN abandoned_threads INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN thread_pool_full BOOLEAN NOT NULL DEFAULT false;
