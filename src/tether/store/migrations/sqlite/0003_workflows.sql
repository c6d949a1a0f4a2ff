-- tether schema, version 3 (SQLite): parent/child jobs, two-phase parents and
-- dependencies. Their cascades run in the store's write transactions (sqlite.py).

ALTER TABLE tether_jobs ADD COLUMN parent_id INTEGER;
ALTER TABLE tether_jobs ADD COLUMN phase TEXT;
ALTER TABLE tether_jobs ADD COLUMN waiting_children INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tether_jobs ADD COLUMN cancel_cascade INTEGER NOT NULL DEFAULT 1;
-- Set once a job spawns a child or gains a dependent: a transition of a job with
-- neither touches no workflow.
ALTER TABLE tether_jobs ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tether_jobs ADD COLUMN has_dependents INTEGER NOT NULL DEFAULT 0;

CREATE INDEX tether_jobs_parent ON tether_jobs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE tether_dependencies (
    job_id     INTEGER NOT NULL,
    depends_on INTEGER NOT NULL,
    PRIMARY KEY (job_id, depends_on),
    CHECK (job_id <> depends_on)
) WITHOUT ROWID;
CREATE INDEX tether_dependencies_upstream ON tether_dependencies (depends_on);
