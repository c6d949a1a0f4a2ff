-- tether schema, version 16 (SQLite): the maintenance leader's lease and the indexes the
-- pruner walks, oldest first, so a round with nothing to prune reads nothing.
CREATE TABLE tether_leaders (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    since      REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX tether_jobs_finished ON tether_jobs (state, finished_at, id)
    WHERE finished_at IS NOT NULL;
CREATE INDEX tether_audit_at ON tether_audit (at);
CREATE INDEX tether_workers_gone ON tether_workers (heartbeat_at)
    WHERE state IN ('stopped', 'dead');
